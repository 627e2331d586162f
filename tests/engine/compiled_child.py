"""Run by tests/engine/test_compiled.py in a process of its own (what the compiler leaves in memory stays there, and
a large heap slows every later test's garbage collection): a `compile=on` tiny engine in each output mode serves
request 0 alone, then in batches of 3 and 8. Prints one JSON line: the dynamo counters before and after serving, each
request's codes and audio (hex digests), and which step class ran.

    python -m tests.engine.compiled_child CACHE_DIR
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from torch._dynamo.utils import counters

from common.request import SpeechRequest
from engine.config import EngineConfig, OutputMode
from engine.engine import Engine
from output_builder.streams import AudioStream
from talker.snapshot import StepSnapshot

TEXTS = ["Hello world, this is the compiled step.", "A second voice joins the batch.", "Three.",
         "Four is a longer sentence than the others.", "Five.", "Six six six.", "Seven.", "Eight and the last."]


def graphs() -> list[int]:
    return [int(counters["stats"]["unique_graphs"]), sum(counters["graph_break"].values())]


async def collect(stream: AudioStream) -> str:
    chunks = [c async for c in stream]
    return hashlib.sha256(np.concatenate(chunks).tobytes() if chunks else b"").hexdigest()


async def run_mode(cache: Path, mode: OutputMode) -> dict[str, Any]:
    config = EngineConfig(model="tiny", device="cpu", cache_dir=cache, max_batch=4, max_queue=8, compile="on",
                          output_mode=mode).tuned(warmup=False)
    engine = Engine(config)
    await engine.start()
    try:
        assert engine.worker is not None and engine.pipeline is not None
        out: dict[str, Any] = {"runner": type(engine.worker.runner).__name__, "before": graphs()}
        codes: defaultdict[str, list[str]] = defaultdict(list)

        def tap(snap: StepSnapshot, frame: np.ndarray) -> None:
            for row, (rid, _, _) in enumerate(snap.rows):
                codes[rid].append(frame[row].tobytes().hex())

        engine.pipeline.tap = tap
        audio: dict[str, str] = {}
        for n in (1, 3):  # buckets 1 and 4 (3 rows and a padding row)
            requests = [SpeechRequest(text=TEXTS[i], seed=40 + i, max_frames=24, request_id=f"{n}-{i}")
                        for i in range(n)]
            digests = await asyncio.gather(*(collect(s) for s in engine.submit_many(requests)))
            audio |= {r.request_id: d for r, d in zip(requests, digests, strict=True)}
        out |= {"after": graphs(), "codes": dict(codes), "audio": audio}
        return out
    finally:
        await engine.stop()


async def main(cache: Path) -> None:
    result = {mode.value: await run_mode(cache, mode) for mode in (OutputMode.ASYNC, OutputMode.SYNC)}
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))

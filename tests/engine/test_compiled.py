"""`compile=on` end to end on the tiny model: the step compiles at start, then serves batches of 1, 3 and 8 with no
new graph and no graph break (torch._dynamo's counters); a request's audio is the same alone and in those batches;
sync and async give the same audio. (The audio of a request alone and in a batch can differ by a rounding: the
codec decodes several requests' chunks in one call; the codes the Talker makes are compared there.)

Inductor's generated code is cached across runs of the suite (the engine's cache would be a fresh temporary
directory each session): the first run on a machine compiles for minutes, later ones reuse it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from torch._dynamo.utils import counters

from engine.config import EngineConfig, OutputMode, default_cache_dir
from engine.engine import Engine
from output_builder.streams import AudioStream
from talker.request import SpeechRequest
from talker.snapshot import StepSnapshot
from talker.static_runner import StaticRunner

TEXTS = ["Hello world, this is the compiled step.", "A second voice joins the batch.", "Three.",
         "Four is a longer sentence than the others.", "Five.", "Six six six.", "Seven.", "Eight and the last."]


@pytest.fixture
def inductor_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = Path(os.environ.get("TALKSTREAM_TEST_INDUCTOR_CACHE", default_cache_dir() / "tests-inductor"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(path))
    yield path


async def collect(stream: AudioStream) -> bytes:
    chunks = [c async for c in stream]
    return np.concatenate(chunks).tobytes() if chunks else b""


def graphs() -> tuple[int, int]:
    return int(counters["stats"]["unique_graphs"]), sum(counters["graph_break"].values())


async def serve(engine: Engine, mode: str) -> tuple[dict[int, list[bytes]], dict[str, list[bytes]]]:
    """Request 0 alone, then in batches of 3 and 8 (the same seed each time) -> each batch's audio, and each
    request's codes (frame by frame, as the Talker made them)."""
    assert engine.pipeline is not None
    codes: defaultdict[str, list[bytes]] = defaultdict(list)

    def tap(snap: StepSnapshot, frame: np.ndarray) -> None:
        for row, (rid, _, _) in enumerate(snap.rows):
            codes[rid].append(frame[row].tobytes())

    engine.pipeline.tap = tap
    out = {}
    for n in (1, 3, 8):
        requests = [SpeechRequest(text=TEXTS[i], seed=40 + i, max_frames=24, request_id=f"{mode}-{n}-{i}")
                    for i in range(n)]
        out[n] = list(await asyncio.gather(*(collect(s) for s in engine.submit_many(requests))))
    return out, codes


@pytest.mark.timeout(1200)  # a cold cache compiles for minutes
async def test_the_compiled_step_serves_any_batch_without_new_graphs(engine_config: EngineConfig,
                                                                     inductor_cache: Path) -> None:
    config = dataclasses.replace(engine_config, compile="on", max_batch=8)
    audio, codes = {}, {}
    for mode in (OutputMode.ASYNC, OutputMode.SYNC):
        engine = Engine(dataclasses.replace(config, output_mode=mode))
        await engine.start()
        try:
            assert engine.worker is not None and isinstance(engine.worker.runner, StaticRunner)
            before = graphs()
            audio[mode], codes[mode] = await serve(engine, mode)
            assert graphs() == before, "a batch made a new graph or a graph break after the warm-up"
        finally:
            await engine.stop()
    made = codes[OutputMode.ASYNC]
    alone = made["async-1-0"]
    assert len(alone) > 2 and alone == made["async-3-0"] == made["async-8-0"]  # alone, in 3, in 8
    assert [made[f"async-8-{i}"] for i in range(8)] == [codes[OutputMode.SYNC][f"sync-8-{i}"] for i in range(8)]
    served = audio[OutputMode.ASYNC]
    assert served == audio[OutputMode.SYNC]
    assert len(set(served[8])) == 8  # the requests did not all say the same thing

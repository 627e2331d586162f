"""Two models in one process, as `talkstream serve --model A --model B` runs them: does a busy one starve the other?

  .venv/bin/python -m benchmarks.models [--model-a tiny] [--model-b DIR] [--streams 8] [--frames 120] [--rounds 3]

Each engine gets --streams requests of --frames frames. Per round: A alone, B alone, then A and B together; it
prints each model's audio seconds per wall second in each phase and, together, the share of its alone figure each
keeps (both well above 0 means neither starves; on 2 cores the two share the machine, so about half each is fair).
Defaults: `tiny` and the official package's tiny CustomVoice checkpoint in tests/fixtures/official.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from common.request import SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine

TEXT = "The quick brown fox jumps over the lazy dog, and the dog jumps back over the fox again and again."


async def load(engine: Engine, streams: int, frames: int, tag: str) -> float:
    """Audio seconds per wall second of `streams` requests run together on `engine`."""
    t0 = time.perf_counter()
    requests = [SpeechRequest(text=TEXT * 4, seed=i, max_frames=frames, request_id=f"{tag}-{i}-{t0}")
                for i in range(streams)]
    samples = 0
    for stream in engine.submit_many(requests):
        async for chunk in stream:
            samples += len(chunk)
    return samples / engine.sample_rate / (time.perf_counter() - t0)


async def run(args: argparse.Namespace) -> None:
    engines = [Engine(EngineConfig.from_env(model=m, max_batch=args.streams, max_queue=args.streams))
               for m in (args.model_a, args.model_b)]
    for e in engines:
        await e.start()
    rounds = []
    try:
        for r in range(args.rounds):
            alone = [await load(e, args.streams, args.frames, f"alone{r}{i}") for i, e in enumerate(engines)]
            together = await asyncio.gather(*(load(e, args.streams, args.frames, f"both{r}{i}")
                                              for i, e in enumerate(engines)))
            rounds.append({"alone": alone, "together": list(together),
                           "kept": [t / a for t, a in zip(together, alone, strict=True)]})
            print(f"round {r + 1}: alone A {alone[0]:.1f} B {alone[1]:.1f} audio s/s | together A {together[0]:.1f} "
                  f"B {together[1]:.1f} | kept A {rounds[-1]['kept'][0]:.0%} B {rounds[-1]['kept'][1]:.0%}")
    finally:
        for e in engines:
            await e.stop()
    kept = [statistics.median(r["kept"][i] for r in rounds) for i in (0, 1)]
    print(f"median share of its alone throughput kept while the other is busy: A {kept[0]:.0%}, B {kept[1]:.0%}")
    print(json.dumps({"models": [args.model_a, args.model_b], "streams": args.streams, "frames": args.frames,
                      "rounds": rounds, "kept_median": kept}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-a", default="tiny")
    p.add_argument("--model-b", default="tests/fixtures/official/qwen3-tts-tiny-official-cv")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--rounds", type=int, default=3)
    asyncio.run(run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time to first audio at the engine (no HTTP): 32 requests submitted at once, for a few admission and chunking
settings, against one request alone. Usage: .venv/bin/python -m benchmarks.engine_ttfa"""

import argparse
import asyncio
import statistics

from common.request import SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine
from output_builder.streams import AudioStream

TEXT = "The quick brown fox jumps over the lazy dog, then streams a little more speech."


async def drain(stream: AudioStream) -> None:
    async for _ in stream:
        pass


async def measure(first_chunk: int, max_prefills: int, streams: int = 32, rounds: int = 3) -> None:
    config = EngineConfig.from_env(max_batch=streams)
    engine = Engine(config.tuned(first_chunk_frames=first_chunk, max_prefills_per_step=max_prefills))
    await engine.start()
    many: list[float] = []
    for _ in range(rounds):
        batch = [engine.submit(SpeechRequest(text=TEXT, seed=i)) for i in range(streams)]
        await asyncio.gather(*(drain(s) for s in batch))
        many += [s.time_to_first_audio * 1e3 for s in batch if s.time_to_first_audio is not None]
    alone: list[float] = []
    for seed in range(5):
        s = engine.submit(SpeechRequest(text="Hello there.", seed=seed))
        await drain(s)
        alone.append((s.time_to_first_audio or 0.0) * 1e3)
    await engine.stop()
    p99 = sorted(many)[round(0.99 * (len(many) - 1))]
    print(f"first_chunk={first_chunk} max_prefills={max_prefills}: {streams} at once TTFA p50 "
          f"{statistics.median(many):.1f} ms p99 {p99:.1f} ms; alone p50 {statistics.median(alone):.1f} ms")


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0]).parse_args(argv)
    for fc, mp in [(2, 8), (1, 8), (1, 32)]:
        asyncio.run(measure(fc, mp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

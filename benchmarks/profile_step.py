"""Where a Talker step's time goes: torch.profiler over a running engine's decode loop (worker thread included).

  .venv/bin/python -m benchmarks.profile_step [--model tiny|PATH] [--device cpu|cuda] [--batch 16] [--steps 50]
                                        [--quantize int8]

Submits --batch requests, lets them reach steady decode, profiles --steps consecutive steps from inside the worker
thread, and prints the ops by self CPU time and, on CUDA, by device time. scripts/gpu_check runs it on the device.
Kineto may print "External init callback must run in same thread as registerClient" when the profiler starts on
the worker thread; the CPU table is complete regardless.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from torch.profiler import ProfilerActivity, profile

from common.request import SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine
from output_builder.streams import AudioStream

TEXT = "The quick brown fox jumps over the lazy dog, then streams a little more speech for the profiler."


class StepWindow:
    """Profiles `steps` consecutive steps from inside the worker thread (torch.profiler records its own thread)."""

    def __init__(self, prof: profile, steps: int) -> None:
        self.prof, self.left, self.done = prof, steps, False
        self.started, self.elapsed = 0.0, 0.0

    def hook(self, stage: str, batch: object) -> None:
        if stage != "step" or self.done:
            return
        if self.started == 0.0:
            self.prof.__enter__()
            self.started = time.perf_counter()
            return
        self.left -= 1
        if self.left == 0:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.elapsed = time.perf_counter() - self.started
            self.prof.__exit__(None, None, None)
            self.done = True


async def drain(stream: AudioStream) -> None:
    async for _ in stream:
        pass


async def run(args: argparse.Namespace) -> None:
    config = EngineConfig.from_env(model=args.model, device=args.device, max_batch=args.batch, max_frames=1024,
                                   quantize=args.quantize)
    engine = Engine(config.tuned(max_prefills_per_step=args.batch))
    await engine.start()
    assert engine.worker is not None
    try:
        streams = engine.submit_many([SpeechRequest(text=TEXT * 4, seed=i, max_frames=1000)
                                      for i in range(args.batch)])
        tasks = [asyncio.create_task(drain(s)) for s in streams]
        await asyncio.sleep(0.5)  # past the prefill, into steady decode
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        window = StepWindow(profile(activities=activities), args.steps)
        engine.worker.fault_hook = window.hook  # called on the worker thread, where the profiler must run
        while not window.done:
            await asyncio.sleep(0.05)
        engine.worker.fault_hook = None
        for s in streams:
            s.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await engine.stop()
    prof, elapsed = window.prof, window.elapsed
    print(f"{args.steps} steps in {elapsed * 1e3:.1f} ms ({elapsed / args.steps * 1e3:.2f} ms a step, profiler on), "
          f"batch {args.batch}, device {args.device}")
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if ProfilerActivity.CUDA in activities:
        print(events.table(sort_by="self_device_time_total", row_limit=args.rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--quantize", choices=("int8",), default=None)
    asyncio.run(run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

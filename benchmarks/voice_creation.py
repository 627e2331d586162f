"""Creating voices while streams play (issue 21): what does a voice creation cost the streams already playing?

  .venv/bin/python -m benchmarks.voice_creation [--model DIR] [--voice in-context|x-vector] [--streams 16]
                                                 [--frames 48] [--seconds 10] [--rounds 3]
  .venv/bin/python -m benchmarks.voice_creation --model DIR --clone-only 5   # clone_prompt alone, no streams

An engine on a Base checkpoint (default: the official package's tiny Base fixture; `talkstream export-tiny DIR --kind
base --size 0.6b` gives the real sizes) makes one voice from the reference recording (in context, with its
transcript, or without it with --voice x-vector), then keeps --streams requests of --frames frames playing in that
voice: each player reads its stream to the end and starts the next. Phases of --seconds alternate, --rounds times:
A quiet, B creating (voices made back to back with `engine.clone_prompt`, with and without the transcript in turn).
Per phase: first audio (submit to first chunk) of the requests started in it, the Talker's step gap and step time,
audio seconds per wall second, and the creations done and their latency. A creation still running when B ends is
awaited before the next A starts (outside both phases). At the end, the medians over rounds side by side and
creating / quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soundfile as sf

from common.request import ClonePrompt, SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine
from talker.snapshot import step_gaps_us

FIXTURES = "tests/fixtures/official"  # run from the repository's root, as the other benchmarks
REFERENCE = f"{FIXTURES}/voice-ref-a.wav"
TRANSCRIPT = "Okay. Yeah. I resent you. I love you. I respect you."
# long enough that --frames, not the end of the text, ends a request (the tiny checkpoints speak a token a frame)
TEXT = ("The quick brown fox jumps over the lazy dog, and the dog jumps back over the fox again and again, "
        "while the water runs down the side of the long hot day.") * 2


@dataclass
class Phase:
    name: str  # "quiet" or "creating"
    round: int
    start: float = 0.0
    end: float = math.inf
    first_audio_s: list[float] = field(default_factory=list)  # of the requests submitted in it
    samples: int = 0  # audio that reached its readers in it
    in_context_s: list[float] = field(default_factory=list)  # creations started in it, with the transcript
    x_vector_s: list[float] = field(default_factory=list)  # and without
    timings: list[Any] = field(default_factory=list)

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


class Bench:
    """The players and the creator, and the phase their figures go to."""

    def __init__(self, engine: Engine, voice: ClonePrompt, wav: np.ndarray, frames: int) -> None:
        self.engine, self.voice, self.wav, self.frames = engine, voice, wav, frames
        self.phase: Phase | None = None  # None while warming up and between phases
        self.stopping = False
        self.ids = itertools.count()

    async def play(self, player: int, streams: int) -> None:
        """One player: a request, read to its end, then the next. The first ones are cut short by different amounts
        so that the players' requests do not all end, and start again, in the same step."""
        frames = 1 + player * self.frames // streams
        while not self.stopping:
            n = next(self.ids)
            request = SpeechRequest(text=TEXT, clone=self.voice, seed=n, max_frames=frames, request_id=f"play-{n}")
            start, first = time.perf_counter(), None
            async for chunk in self.engine.submit(request):
                now = time.perf_counter()
                if (phase := self.phase) is not None and phase.holds(now):
                    phase.samples += len(chunk)
                if first is None:
                    first = now
                    if phase is not None and phase.holds(start):
                        phase.first_audio_s.append(first - start)
            frames = self.frames

    async def create(self, phase: Phase) -> None:
        """Voices back to back until the phase ends, in context and x-vector only in turn."""
        for i in itertools.count():
            if time.perf_counter() >= phase.end:
                return
            start = time.perf_counter()
            await self.engine.clone_prompt(fresh(self.wav, i + 1), TRANSCRIPT if i % 2 == 0 else None)
            (phase.x_vector_s if i % 2 else phase.in_context_s).append(time.perf_counter() - start)

    async def run_phase(self, phase: Phase, seconds: float) -> Phase:
        worker = self.engine.worker
        assert worker is not None
        worker.timings.clear()
        phase.start = time.perf_counter()
        phase.end = phase.start + seconds
        self.phase = phase
        creator = asyncio.create_task(self.create(phase)) if phase.name == "creating" else None
        await asyncio.sleep(seconds)
        phase.timings = [t for t in worker.timings.snapshot() if phase.holds(t.forward_start)]
        self.phase = None
        if creator is not None:
            await creator  # the creation in flight ends before the next phase starts
        return phase


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (with few values, p99 is the slowest); nan for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(phase: Phase, sample_rate: int) -> dict[str, Any]:
    gaps = step_gaps_us(phase.timings)
    steps = [(t.sample_end - t.forward_start) * 1e3 for t in phase.timings if t.sample_end]
    return {
        "phase": phase.name, "round": phase.round, "requests": len(phase.first_audio_s),
        "first_audio_p50_ms": pct(phase.first_audio_s, 0.5) * 1e3,
        "first_audio_p99_ms": pct(phase.first_audio_s, 0.99) * 1e3,
        "step_gap_p50_us": pct(gaps, 0.5), "step_gap_p99_us": pct(gaps, 0.99),
        "step_p50_ms": pct(steps, 0.5), "steps": len(phase.timings),
        "audio_s_per_s": phase.samples / sample_rate / (phase.end - phase.start),
        "creations": len(phase.in_context_s) + len(phase.x_vector_s),
        "in_context_p50_s": pct(phase.in_context_s, 0.5), "x_vector_p50_s": pct(phase.x_vector_s, 0.5),
    }


KEYS = ("first_audio_p50_ms", "first_audio_p99_ms", "step_gap_p50_us", "step_gap_p99_us", "step_p50_ms",
        "audio_s_per_s", "requests", "creations", "in_context_p50_s", "x_vector_p50_s")


def compare(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Medians over rounds, quiet and creating, and their ratio."""
    out: dict[str, dict[str, float]] = {}
    for key in KEYS:
        quiet, busy = ([r[key] for r in rows if r["phase"] == name and not math.isnan(r[key])]
                       for name in ("quiet", "creating"))
        q = statistics.median(quiet) if quiet else math.nan
        b = statistics.median(busy) if busy else math.nan
        out[key] = {"quiet": q, "creating": b, "ratio": b / q if q else math.nan}
    return out


def print_row(r: dict[str, Any]) -> None:
    print(f"round {r['round']} {r['phase']:>8}: first audio p50 {r['first_audio_p50_ms']:7.1f} p99 "
          f"{r['first_audio_p99_ms']:7.1f} ms ({r['requests']} req) | gap p50 {r['step_gap_p50_us']:7.1f} p99 "
          f"{r['step_gap_p99_us']:8.1f} us | step p50 {r['step_p50_ms']:6.1f} ms | {r['audio_s_per_s']:6.2f} audio s/s"
          f" | {r['creations']} creations, p50 {r['in_context_p50_s']:.3f} s in context, "
          f"{r['x_vector_p50_s']:.3f} s x-vector", flush=True)


def load_reference() -> np.ndarray:
    wav, rate = sf.read(REFERENCE, dtype="float32")
    assert rate == 24000 and wav.ndim == 1, (rate, wav.shape)
    return np.ascontiguousarray(wav)


def fresh(wav: np.ndarray, i: int) -> np.ndarray:
    """The reference with one sample nudged by `i` ulps: the same work, but not a reference the engine's clone
    cache has seen."""
    out = wav.copy()
    out.view(np.int32)[0] += i
    return out


async def timed_creation(engine: Engine, wav: np.ndarray, transcript: str | None) -> tuple[ClonePrompt, float]:
    start = time.perf_counter()
    voice = await engine.clone_prompt(wav, transcript)
    return voice, time.perf_counter() - start


async def clone_only(engine: Engine, wav: np.ndarray, count: int) -> dict[str, Any]:
    """clone_prompt alone: the first call (which loads both encoders), then `count` more of each kind."""
    _, first = await timed_creation(engine, wav, TRANSCRIPT)
    times: dict[str, list[float]] = {"in_context": [], "x_vector": []}
    for i in range(count):
        times["in_context"].append((await timed_creation(engine, fresh(wav, 2 * i + 1), TRANSCRIPT))[1])
        times["x_vector"].append((await timed_creation(engine, fresh(wav, 2 * i + 2), None))[1])
    result = {"first_s": first, **{f"{k}_p50_s": statistics.median(v) for k, v in times.items()}, "times": times}
    print(f"first creation (loads the encoders) {first:.3f} s; then median of {count}: in context "
          f"{result['in_context_p50_s']:.3f} s, x-vector only {result['x_vector_p50_s']:.3f} s")
    return result


async def alternate(engine: Engine, wav: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    voice, first = await timed_creation(engine, wav, TRANSCRIPT if args.voice == "in-context" else None)
    print(f"the streams' voice: {args.voice}, {len(voice.ref_codes or ())} reference frames, created in "
          f"{first:.3f} s (the first creation loads the encoders)")
    bench = Bench(engine, voice, wav, args.frames)
    players = [asyncio.create_task(bench.play(i, args.streams)) for i in range(args.streams)]
    rows = []
    try:
        await asyncio.sleep(args.warmup)
        for r, name in itertools.product(range(1, args.rounds + 1), ("quiet", "creating")):
            rows.append(summary(await bench.run_phase(Phase(name, r), args.seconds), engine.sample_rate))
            print_row(rows[-1])
    finally:
        bench.stopping = True
        await asyncio.gather(*players)
    return {"first_creation_s": first, "phases": rows, "medians": compare(rows)}


def print_medians(medians: dict[str, dict[str, float]]) -> None:
    print(f"{'median over rounds':>20} {'quiet':>10} {'creating':>10} {'ratio':>7}")
    for key, m in medians.items():
        print(f"{key:>20} {m['quiet']:10.2f} {m['creating']:10.2f} {m['ratio']:7.2f}")


async def run(args: argparse.Namespace) -> None:
    config = EngineConfig.from_env(model=args.model, max_batch=args.streams, max_queue=args.streams)
    engine = Engine(config)
    await engine.start()
    wav = load_reference()
    try:
        if args.clone_only:
            result = await clone_only(engine, wav, args.clone_only)
        else:
            result = await alternate(engine, wav, args)
            print_medians(result["medians"])
    finally:
        await engine.stop()
    settings = {k: getattr(args, k) for k in ("model", "voice", "streams", "frames", "seconds", "rounds", "warmup")}
    print(json.dumps({**settings, "reference_s": len(wav) / 24000, **result}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=f"{FIXTURES}/qwen3-tts-tiny-official-base")
    p.add_argument("--voice", default="in-context", choices=("in-context", "x-vector"),
                   help="the streams' voice: made with the transcript (in-context cloning) or without (x-vector only)")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--frames", type=int, default=48)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=3.0, help="streams play this long before the first phase")
    p.add_argument("--clone-only", type=int, default=0, metavar="N",
                   help="no streams: time the first clone_prompt, then N of each kind, and stop")
    asyncio.run(run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

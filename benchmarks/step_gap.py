"""`talkstream bench step-gap`: the same fixed workload in both output modes, side by side in one process.

The workload: `--batch` requests (seeded, sampled) submitted together and admitted one per step, so their chunk
boundaries are staggered as with real arrivals, each generating `--steps` frames. For each mode it prints the step
gap (end of step N's sample to start of step N+1's forward) p50/p99, the step time, frames/s and audio seconds per
wall second, then whether both modes produced byte-identical audio and the same codes, and the ratio of the gaps.
It also writes an SVG timeline of a window of consecutive steps in both modes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.op_count import step_ops
from common.request import SpeechRequest
from engine.config import EngineConfig, OutputMode
from engine.engine import Engine
from engine.tiny import ensure_tiny
from frontend.frontend import FRAMES_PER_TOKEN, Frontend, load_tokenizer
from output_builder.streams import AudioStream
from talker.device import resolve_device
from talker.models.hub import resolve
from talker.models.loader import load_talker, resolve_dtype
from talker.snapshot import StepTiming, gpu_gaps_us, step_gaps_us

TEXT = "hello world this is the talkstream step gap benchmark " * 15
FRAME_S = 0.08


@dataclass(slots=True)
class ModeResult:
    timings: list[StepTiming]
    audio: list[bytes]
    codes: list[bytes]  # each request's codes, frame after frame (int32)
    wall_s: float
    frames: int
    memory: dict[str, int]

    def summary(self) -> dict[str, float]:
        gaps = step_gaps_us(self.timings)
        steps = [(t.sample_end - t.forward_start) * 1e3 for t in self.timings]
        return {
            "gap_us_p50": round(statistics.median(gaps), 1),
            "gap_us_p99": round(percentile(gaps, 99), 1),
            "gap_us_mean": round(statistics.fmean(gaps), 1),
            "step_ms_p50": round(statistics.median(steps), 3),
            "frames_per_s": round(self.frames / self.wall_s, 1),
            "audio_s_per_s": round(self.frames * FRAME_S / self.wall_s, 2),
            "steps": len(self.timings),
        } | _gpu_summary(self.timings)


def _gpu_summary(timings: list[StepTiming]) -> dict[str, float]:
    gaps = gpu_gaps_us(timings)
    return {"gpu_gap_us_p50": round(statistics.median(gaps), 1)} if gaps else {}


def _spin(n: int) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(n):
        total += i
    return time.perf_counter() - start


def cpu_parallelism(n: int = 3_000_000) -> float:
    """How many cores two busy processes really get right now (2.0 on an idle 2-core machine). These machines
    are shared: read the async/sync throughput ratio in its light."""
    alone = _spin(n)
    with ProcessPoolExecutor(2) as pool:
        both = list(pool.map(_spin, [n, n]))
    return round(2 * alone / max(both), 2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def identical(a: list[bytes], b: list[bytes]) -> bool:
    """Both modes made the same output for every request, and some for each: two empty runs prove nothing."""
    return bool(a) and len(a) == len(b) and all(a) and a == b


def max_sample_diff(a: list[bytes], b: list[bytes]) -> int | None:
    """Largest |difference| between the two modes' int16 samples (None if some request's length differs)."""
    worst = 0
    for x, y in zip(a, b, strict=True):
        if len(x) != len(y):
            return None
        if x != y:
            diff = np.frombuffer(x, np.int16).astype(np.int32) - np.frombuffer(y, np.int16).astype(np.int32)
            worst = max(worst, int(np.abs(diff).max()))
    return worst


def _codes_by_request(steps: list[tuple[tuple[Any, ...], np.ndarray]], ids: list[tuple[str, int]]) -> list[bytes]:
    """Each request's accepted frames (up to EOS: rows after it depend on when the worker retired the request)."""
    rows: dict[str, list[bytes]] = {rid: [] for rid, _ in ids}
    for step_rows, codes in steps:  # codes: [B, G]
        for row, (rid, _, _) in enumerate(step_rows):
            rows[rid].append(codes[row].astype(np.int32).tobytes())
    return [b"".join(rows[rid][:frames]) for rid, frames in ids]


async def _drain(stream: AudioStream) -> bytes:
    return b"".join([chunk.tobytes() async for chunk in stream])


async def run_mode(args: argparse.Namespace, mode: OutputMode) -> ModeResult:
    # a generation's frame cap that keeps the first `steps` tokens of TEXT in its first segment (a long text is
    # spoken in segments of max_frames // FRAMES_PER_TOKEN tokens): every row runs `steps` frames, and only the
    # requests' own limit ends them, with no segment's prefill in between
    generation = FRAMES_PER_TOKEN * args.steps
    config = EngineConfig.from_env(
        model=args.model, device=args.device, output_mode=mode, max_batch=args.batch, max_queue=0,
        max_frames=generation, max_len=max(2048, 2 * generation + 64),
    ).tuned(max_prefills_per_step=1)
    engine = Engine(config)
    await engine.start()
    try:
        assert engine.worker is not None
        engine.worker.timings.clear()
        requests = [SpeechRequest(text=TEXT, seed=1000 + i, max_frames=args.steps, request_id=f"bench-{mode}-{i}")
                    for i in range(args.batch)]
        assert engine.pipeline is not None
        steps: list[tuple[tuple[Any, ...], np.ndarray]] = []
        engine.pipeline.tap = lambda snap, codes: steps.append((snap.rows, codes))  # no copy: the codes are kept
        start = time.perf_counter()
        streams = engine.submit_many(requests)
        audio = await asyncio.gather(*(_drain(s) for s in streams))
        wall = time.perf_counter() - start
        frames = sum(s.usage.frames for s in streams)
        accepted = [(r.request_id, s.usage.frames) for r, s in zip(requests, streams, strict=True)]
        codes = _codes_by_request(steps, accepted)
        return ModeResult(engine.worker.timings.snapshot(), audio, codes, wall, frames, engine.memory())
    finally:
        await engine.stop()


def timeline_svg(results: dict[OutputMode, ModeResult], window: int = 10, width: int = 1100) -> str:
    """Consecutive steps of each mode on one time axis: forward (blue), sample + code predictor (orange),
    the gap to the next step's forward (red)."""
    rows = []
    for mode, res in results.items():
        full = max((t.batch for t in res.timings), default=0)
        steady = [t for t in res.timings if t.contiguous and t.batch == full]
        mid = len(steady) // 2
        rows.append((mode, steady[mid : mid + window]))
    span = max((p[-1].sample_end - p[0].forward_start for _, p in rows if p), default=1.0)
    scale = (width - 150) / span
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{80 + 70 * len(rows)}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="10" y="20" font-size="14">Talker decode loop, {window} consecutive steps per output mode '
        "(measured)</text>",
        '<text x="10" y="38">blue: forward · orange: sample + code predictor · red: gap before the next forward'
        f" · {span * 1e3:.1f} ms across</text>",
    ]
    for i, (mode, pick) in enumerate(rows):
        y = 55 + 70 * i
        parts.append(f'<text x="10" y="{y + 20}">{mode.value}</text>')
        parts += _row(pick, y, scale)
    parts.append("</svg>")
    return "\n".join(parts)


def _row(pick: list[StepTiming], y: int, scale: float) -> list[str]:
    if not pick:
        return []
    t0, out = pick[0].forward_start, []
    for a, b in zip(pick, [*pick[1:], None], strict=True):
        out.append(_bar(150 + (a.forward_start - t0) * scale, y, (a.forward_end - a.forward_start) * scale, "#4a7fd4"))
        out.append(_bar(150 + (a.forward_end - t0) * scale, y, (a.sample_end - a.forward_end) * scale, "#f0a030"))
        if b is not None:
            out.append(_bar(150 + (a.sample_end - t0) * scale, y, (b.forward_start - a.sample_end) * scale, "#d43a3a"))
    gaps = step_gaps_us(pick)
    out.append(f'<text x="150" y="{y + 48}">median gap in this window: {statistics.median(gaps):.0f} µs</text>')
    return out


def _bar(x: float, y: int, w: float, color: str) -> str:
    return f'<rect x="{x:.2f}" y="{y}" width="{max(w, 0.6):.2f}" height="30" fill="{color}"/>'


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    before = cpu_parallelism()
    results = {mode: await run_mode(args, mode) for mode in (OutputMode.SYNC, OutputMode.ASYNC)}
    out: dict[str, Any] = {mode.value: res.summary() for mode, res in results.items()}
    out["cpu_parallelism"] = [before, cpu_parallelism()]
    a, s = out["async"], out["sync"]
    out["gap_ratio"] = round(s["gap_us_p50"] / a["gap_us_p50"], 1)
    out["gap_ratio_mean"] = round(s["gap_us_mean"] / a["gap_us_mean"], 1)
    out["throughput_ratio"] = round(a["frames_per_s"] / s["frames_per_s"], 3)
    out["identical"] = identical(results[OutputMode.SYNC].audio, results[OutputMode.ASYNC].audio)
    out["identical_codes"] = identical(results[OutputMode.SYNC].codes, results[OutputMode.ASYNC].codes)
    out["max_sample_diff"] = max_sample_diff(results[OutputMode.SYNC].audio, results[OutputMode.ASYNC].audio)
    out["batch"], out["frames_per_request"] = args.batch, args.steps
    out["memory"] = results[OutputMode.SYNC].memory  # the sync engine holds the codec here, so it sizes its state
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    # torch calls and host syncs of one steady step (benchmarks/op_count.py), counted after the timed runs
    out |= await asyncio.to_thread(measure, EngineConfig.from_env(model=args.model, device=args.device), args.batch)
    if args.svg:
        Path(args.svg).parent.mkdir(parents=True, exist_ok=True)
        Path(args.svg).write_text(timeline_svg(results))
        out["svg"] = str(args.svg)
    return out


def measure(config: EngineConfig, batch: int) -> dict[str, Any]:
    """`step_ops` of the configured model and device, loaded here on its own (no engine, no codec)."""
    device = resolve_device(config.device)
    path = ensure_tiny(config.cache_dir) if config.model == "tiny" else resolve(config.model, config.revision)
    loaded = load_talker(path, device, resolve_dtype(config.dtype, device), config.quantize)
    frontend = Frontend(loaded.cfg, loaded.generation, load_tokenizer(path), 512, config.tuning.text_width, 512)
    with torch.inference_mode():
        return step_ops(loaded, frontend, device, batch)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="talkstream bench step-gap", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=200, help="frames per request")
    p.add_argument("--svg", default="step-gap-timeline.svg", help="where to write the timeline ('' to skip)")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    return p


def report(out: dict[str, Any]) -> None:
    for mode in ("sync", "async"):
        m = out[mode]
        print(f"{mode:>5}: gap p50 {m['gap_us_p50']:8.1f} us  p99 {m['gap_us_p99']:8.1f} us  "
              f"mean {m['gap_us_mean']:8.1f} us  step {m['step_ms_p50']:6.2f} ms  "
              f"{m['frames_per_s']:7.1f} frames/s  {m['audio_s_per_s']:6.2f} audio s/s")
    print(f"gap ratio sync/async (p50): {out['gap_ratio']}x  (mean): {out['gap_ratio_mean']}x  "
          f"throughput async/sync: {out['throughput_ratio']}  identical audio: {out['identical']} "
          f"(max sample difference {out['max_sample_diff']}), identical codes: {out['identical_codes']}")
    print(f"cores two busy processes got (before, after): {out['cpu_parallelism']}")
    print(f"one steady step at batch {out['batch']}: {out['ops_per_step']} torch calls, {out['host_syncs_per_step']} "
          f"host syncs {out['host_syncs_by_op']}, {out['host_uploads_per_step']} tensors made from host data")
    mem = out["memory"]
    print(f"memory: {mem.get('bytes_per_request', 0) / 1024:.1f} KiB per active request "
          f"(Talker slot {mem.get('slot_bytes', 0) / 1024:.1f} KiB + codec state "
          f"{mem.get('codec_state_bytes', 0) / 1024:.1f} KiB); peak RSS {out['peak_rss_mb']} MiB")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = asyncio.run(bench(args))
    report(out)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

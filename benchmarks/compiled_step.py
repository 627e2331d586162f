"""`talkstream bench compiled-step`: the eager step against the compiled one (talker/compiled.py), side by side in
one process, on the same workload: N requests of exactly F frames each (EOS held off: a benchmark-only knob), for
each N given. Per mode: the start (with the compile), the first workload after it and the steady state (median of
the other rounds), frames and audio seconds per wall second, the step's median, first audio; for the compiled mode
the graphs dynamo made (none may appear after the warm-up) and greedy code agreement with eager.

    .venv/bin/python -m benchmarks.compiled_step --model tiny --requests 1,16 --frames 40
    .venv/bin/python -m benchmarks.compiled_step --model /tmp/cv-0.6b --requests 1,4 --frames 40 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from typing import Any

import numpy as np
import torch

import talker.models.qwen3_tts.static as static_math
import talker.runner as eager_math
from common.request import SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine
from output_builder.streams import AudioStream
from talker.snapshot import step_gaps_us

TEXT = "The quick brown fox jumps over the lazy dog, then streams a little more speech for the benchmark."
FRAME_S = 0.08


def to_the_cap() -> None:
    """Every request runs to its frame cap: EOS is never drawn (random weights end speech at random frames)."""
    eager_math.MIN_FRAMES_BEFORE_EOS = 1 << 30
    static_math.MIN_FRAMES_BEFORE_EOS = 1 << 30


async def _drain(stream: AudioStream) -> None:
    async for _ in stream:
        pass


def _graphs() -> dict[str, int]:
    from torch._dynamo.utils import counters
    return {"graphs": int(counters["stats"]["unique_graphs"]), "breaks": sum(counters["graph_break"].values())}


async def run_mode(args: argparse.Namespace, mode: str, counts: list[int]) -> dict[str, Any]:
    config = EngineConfig.from_env(model=args.model, device=args.device, compile=mode, quantize=args.quantize,
                                   max_batch=max(counts), max_queue=0, max_frames=max(args.frames, 64),
                                   max_len=args.max_len)
    engine = Engine(config.tuned(warmup=False))
    started = time.perf_counter()
    await engine.start()
    out: dict[str, Any] = {"start_s": round(time.perf_counter() - started, 1), "compiled": _is_static(engine)}
    after_start = _graphs()
    assert engine.pipeline is not None and engine.worker is not None
    for n in counts:
        rounds = []
        for r in range(args.rounds):
            engine.worker.timings.clear()
            reqs = [SpeechRequest(text=TEXT, seed=100 + i, max_frames=args.frames) for i in range(n)]
            t0 = time.perf_counter()
            streams = engine.submit_many(reqs)
            await asyncio.gather(*(_drain(s) for s in streams))
            wall = time.perf_counter() - t0
            frames = sum(s.usage.frames for s in streams)
            timings = engine.worker.timings.snapshot()
            steps = [t.sample_end - t.forward_start for t in timings if t.batch == n]
            gaps = step_gaps_us([t for t in timings if t.batch == n])
            ttfa = [s.time_to_first_audio for s in streams if s.time_to_first_audio is not None]
            rounds.append({"round": r, "frames": frames, "wall_s": wall, "frames_per_s": frames / wall,
                           "step_ms_p50": 1e3 * statistics.median(steps) if steps else None,
                           "ttfa_ms_p50": 1e3 * statistics.median(ttfa) if ttfa else None,
                           "gap_us_p50": statistics.median(gaps) if gaps else None})
        steady = rounds[1:] or rounds
        out[str(n)] = {"first": _rounded(rounds[0]), "steady": _rounded(_medians(steady))}
    out["greedy_codes"] = await _greedy_codes(engine, args.frames)
    after = _graphs()
    out["new_graphs_after_start"] = after["graphs"] - after_start["graphs"]
    out["graph_breaks"] = after["breaks"]
    await engine.stop()
    if out["compiled"]:
        assert engine.worker is not None
        out["kernels_per_step"] = kernels_per_step(engine.worker.runner)
    return out


def launches(source: str) -> tuple[int, int]:
    """Inductor's generated code (a program's module) -> the kernels its entry runs (C++ on the CPU, Triton on
    CUDA) and the library or custom-op calls it makes. The entry is Python's `call`, or with the C++ wrapper (the
    CPU's) `inductor_entry_impl`, whose library calls go through `aoti_torch_cpu_*` and the dispatcher."""
    if "void inductor_entry_impl(" in source:
        start = source.index("void inductor_entry_impl(")
        body = source[start:source.index("} // inductor_entry_impl", start)]
        kernels = len(re.findall(r"^\s+cpp_fused_\w+\(", body, re.M))
        return kernels, len(re.findall(r"\b(?:aoti_torch_cpu_\w+|aoti_torch_call_dispatcher)\(", body))
    body = source[source.index("def call("):]
    kernels = len(re.findall(r"^\s+(?:cpp_fused_\w+|triton_\w+\.run)\(", body, re.M))
    return kernels, len(re.findall(r"(?:extern_kernels|torch\.ops)\.[\w.]+\(", body))


def kernels_per_step(runner: Any) -> dict[str, Any]:
    """What one steady step launches at the runner's largest bucket, read from the code Inductor generates: its own
    kernels plus library and custom-op calls, for `decode` and `first` once and `next` G - 2 times. (A custom op
    counts once; on the CPU `slot_attention` makes one attention call per row inside, `uniforms` a few dozen small
    ops.) The programs are compiled again (from Inductor's cache) to read their code, so this runs last."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    bucket = runner.programs.buckets[-1]
    _, sources = run_and_get_code(runner.warm_up, (bucket,))
    assert len(sources) == 3, f"expected the decode, first and next programs' code, got {len(sources)}"
    out: dict[str, Any] = {"bucket": bucket}
    total = 0
    for name, calls, src in zip(("decode", "first", "next"), (1, 1, runner.groups - 2), sources, strict=True):
        kernels, library = launches(src)
        out[name] = {"kernels": kernels, "library_calls": library, "calls_per_step": calls}
        total += calls * (kernels + library)
    out["per_step"] = total
    return out


def _is_static(engine: Engine) -> bool:
    from talker.static_runner import StaticRunner
    return engine.worker is not None and isinstance(engine.worker.runner, StaticRunner)


async def _greedy_codes(engine: Engine, frames: int) -> list[list[int]]:
    assert engine.pipeline is not None
    rows: list[list[int]] = []
    engine.pipeline.tap = lambda snap, codes: rows.extend(codes[i].tolist() for i in range(len(snap.rows)))
    stream = engine.submit(SpeechRequest(text=TEXT, seed=7, max_frames=frames, temperature=0.0))
    await _drain(stream)
    engine.pipeline.tap = None
    return rows


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("frames_per_s", "step_ms_p50", "ttfa_ms_p50", "gap_us_p50")
    return {k: statistics.median(r[k] for r in rounds) for k in keys if all(r[k] is not None for r in rounds)}


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    """Greedy codes of the two modes: frames equal before the first that differs, and codes equal overall."""
    n = min(len(a), len(b))
    if not n:
        return {"frames": 0}
    x, y = np.array(a[:n]), np.array(b[:n])
    same = (x == y).all(axis=1)
    first_diff = int(np.argmin(same)) if not same.all() else n
    return {"frames": n, "identical_prefix_frames": first_diff, "codes_equal": round(float((x == y).mean()), 4),
            "code0_equal": round(float((x[:, 0] == y[:, 0]).mean()), 4)}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    to_the_cap()
    counts = [int(c) for c in args.requests.split(",")]
    results = {mode: await run_mode(args, mode, counts) for mode in ("off", "on")}
    eager, compiled = results["off"], results["on"]
    summary: dict[str, Any] = {"model": args.model, "quantize": args.quantize, "frames": args.frames,
                               "threads": torch.get_num_threads(), "eager": eager, "compiled": compiled}
    for n in counts:
        for phase in ("first", "steady"):
            summary[f"ratio_{n}_{phase}"] = round(compiled[str(n)][phase]["frames_per_s"]
                                                  / eager[str(n)][phase]["frames_per_s"], 3)
    summary["greedy_agreement"] = agreement(eager.pop("greedy_codes"), compiled.pop("greedy_codes"))
    return summary


def report(s: dict[str, Any], counts: list[int]) -> None:
    for mode in ("eager", "compiled"):
        m = s[mode]
        print(f"{mode:>8}: start {m['start_s']} s, step compiled: {m['compiled']}, new graphs after start "
              f"{m['new_graphs_after_start']}, graph breaks {m['graph_breaks']}")
        for n in counts:
            for phase in ("first", "steady"):
                r = m[str(n)][phase]
                print(f"          {n:>2} request(s) {phase:>6}: {r['frames_per_s']:8.2f} frames/s "
                      f"({r['frames_per_s'] * FRAME_S:6.3f} audio s/s)  step p50 {r.get('step_ms_p50')} ms  "
                      f"first audio p50 {r.get('ttfa_ms_p50')} ms  step gap p50 {r.get('gap_us_p50')} us")
    k = s["compiled"].get("kernels_per_step")
    if k:
        parts = ", ".join(f"{p} {k[p]['kernels']} + {k[p]['library_calls']} x {k[p]['calls_per_step']}"
                          for p in ("decode", "first", "next"))
        print(f"compiled: {k['per_step']} kernels and library calls a step at bucket {k['bucket']} ({parts})")
    for n in counts:
        print(f"compiled / eager, {n} request(s): first workload {s[f'ratio_{n}_first']}x, "
              f"steady {s[f'ratio_{n}_steady']}x")
    print("greedy codes, compiled against eager:", s["greedy_agreement"])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="talkstream bench compiled-step", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="auto")
    p.add_argument("--quantize", choices=("int8",), default=None)
    p.add_argument("--requests", default="1,16", help="request counts, comma-separated (each runs alone)")
    p.add_argument("--frames", type=int, default=40, help="frames per request (each runs exactly this many)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-len", type=int, default=1024, help="KV positions per slot (the programs' shapes)")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    summary = asyncio.run(bench(args))
    report(summary, [int(c) for c in args.requests.split(",")])
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One side of the side-by-side benchmark (scripts/bench_reference runs both, one after the other).

    --side official    in the oracle environment: the official package as its users run it, one batched
                       `generate_custom_voice` call for all requests (which decodes too); every request's audio exists
                       when the call returns, so that is its time to first audio.
    --side talkstream  in Talkstream's environment: the Engine in-process (async output mode), all requests
                       submitted at once, each streamed; time to first audio is the first PCM chunk.
    --report O1 T1 ... combines rounds of the two sides' JSON (official, talkstream, ...) into per-round lines, the
                       medians over rounds and one final JSON line.

Both sides: the same checkpoint, the same --requests requests (texts x voices, default 16), each capped at
--max-frames frames when given, the checkpoint's default sampling (generation_config.json) with the same text mode
(streaming text, as that config says), one warm-up request first, then --repeat timed runs (default 3) of which the
median (by throughput) is reported. Talkstream's side takes --quantize and --dtype as `talkstream serve` does.
--to-the-cap (with --max-frames) runs every request to exactly its cap on both sides: `min_new_tokens` on the official
side, EOS held off on Talkstream's (a benchmark-only knob), so random weights' random speech ends do not decide the
ratio; each side's frames per request are reported so the cap can be seen to hold.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

TEXTS = [
    "hello world this is a tiny test of the speech stream",
    "the quick brown fox jumps over the lazy dog and then the dog jumps over the fox",
    "we can talk about the water and the day when you come to see what people know",
    "this voice will make some sound for each word that you write in the test",
]
VOICES = ["aria", "ben", "cleo", "dev"]
FRAME_S = 0.08  # audio seconds per codec frame (12.5 Hz)


def workload(n: int) -> list[tuple[str, str]]:
    return [(TEXTS[i % len(TEXTS)], VOICES[(i // len(TEXTS)) % len(VOICES)]) for i in range(n)]


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput, with every run's throughput attached."""
    ordered = sorted(runs, key=lambda r: r["audio_s_per_wall_s"])
    return {**ordered[len(ordered) // 2], "repeats": [round(r["audio_s_per_wall_s"], 2) for r in runs]}


def run_official(ckpt: Path, threads: int, repeat: int, n: int, max_frames: int | None, to_cap: bool
                 ) -> dict[str, Any]:
    import torch
    from qwen_tts import Qwen3TTSModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tts = Qwen3TTSModel.from_pretrained(str(ckpt), dtype=torch.float32)
    cap = {} if max_frames is None else {"max_new_tokens": max_frames}
    if to_cap:
        cap["min_new_tokens"] = max_frames
    tts.generate_custom_voice(text="hello", speaker="aria", non_streaming_mode=False, **cap)  # warm-up
    texts, voices = zip(*workload(n), strict=True)
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        wavs, sr = tts.generate_custom_voice(text=list(texts), speaker=list(voices), language=["Auto"] * n,
                                             non_streaming_mode=False, **cap)
        wall = time.perf_counter() - t0
        runs.append(summary("official qwen-tts 0.1.1", [wall] * n, [len(w) / sr for w in wavs], wall))
    return median_run(runs)


async def _talkstream(ckpt: Path, threads: int, repeat: int, n: int, max_frames: int | None, quantize: str | None,
                      dtype: str, to_cap: bool) -> dict[str, Any]:
    from benchmarks.compiled_step import to_the_cap
    from common.request import SpeechRequest
    from engine.config import EngineConfig
    from engine.engine import Engine

    if to_cap:
        to_the_cap()
    engine = Engine(EngineConfig(model=str(ckpt), device="cpu", max_batch=n, max_queue=n, quantize=quantize,
                                 dtype=dtype).tuned(torch_threads=threads))
    await engine.start()  # includes a warm-up request
    rate = engine.sample_rate
    runs = []
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            requests = [SpeechRequest(text=t, voice=v, seed=i, max_frames=max_frames)
                        for i, (t, v) in enumerate(workload(n))]
            streams = engine.submit_many(requests)

            async def consume(stream: Any, t0: float = t0) -> tuple[float, int]:
                first, samples = 0.0, 0
                async for chunk in stream:
                    if samples == 0 and len(chunk):
                        first = time.perf_counter() - t0
                    samples += len(chunk)
                return first, samples

            results = await asyncio.gather(*(consume(s) for s in streams))
            wall = time.perf_counter() - t0
            name = "talkstream engine (async" + "".join(f", {x}" for x in (quantize, dtype) if x not in (None, "auto"))
            runs.append(summary(name + ")", [r[0] for r in results],
                                [r[1] / rate for r in results], wall))
    finally:
        await engine.stop()
    return median_run(runs)


def summary(name: str, ttfa: list[float], audio: list[float], wall: float) -> dict[str, Any]:
    return {
        "side": name,
        "requests": len(audio),
        "ttfa_p50_s": statistics.median(ttfa),
        "ttfa_max_s": max(ttfa),
        "audio_s": sum(audio),
        "wall_s": wall,
        "audio_s_per_wall_s": sum(audio) / wall,
        "frames_per_request": sorted({round(a / FRAME_S) for a in audio}),
    }


def report(officials: list[dict[str, Any]], ours_runs: list[dict[str, Any]], label: str) -> dict[str, Any]:
    """One row per round (the two sides ran one after the other), then the medians over rounds."""
    rounds = []
    for i, (official, ours) in enumerate(zip(officials, ours_runs, strict=True), 1):
        rnd = {"official": official, "talkstream": ours,
               "throughput_ratio": ours["audio_s_per_wall_s"] / official["audio_s_per_wall_s"],
               "ttfa_p50_ratio": official["ttfa_p50_s"] / ours["ttfa_p50_s"]}
        rounds.append(rnd)
        print(f"round {i}: official {official['audio_s_per_wall_s']:6.3f} audio s/s, first audio "
              f"{official['ttfa_p50_s'] * 1e3:6.0f} ms | talkstream {ours['audio_s_per_wall_s']:6.3f} audio s/s, "
              f"first audio p50 {ours['ttfa_p50_s'] * 1e3:5.1f} ms (max {ours['ttfa_max_s'] * 1e3:5.1f}) | "
              f"throughput {rnd['throughput_ratio']:.2f}x, first audio {rnd['ttfa_p50_ratio']:.0f}x")

    def median(side: str, key: str) -> float:
        return statistics.median(r[side][key] for r in rounds)

    result = {
        "workload": label,
        "talkstream_side": ours_runs[0]["side"],
        "rounds": rounds,
        "official_audio_s_per_wall_s": median("official", "audio_s_per_wall_s"),
        "talkstream_audio_s_per_wall_s": median("talkstream", "audio_s_per_wall_s"),
        "official_ttfa_s": median("official", "ttfa_p50_s"),
        "talkstream_ttfa_p50_s": median("talkstream", "ttfa_p50_s"),
        "throughput_ratio": statistics.median(r["throughput_ratio"] for r in rounds),
        "ttfa_p50_ratio": statistics.median(r["ttfa_p50_ratio"] for r in rounds),
    }
    print(f"{label}, {ours_runs[0]['side']}: median over {len(rounds)} rounds: official "
          f"{result['official_audio_s_per_wall_s']:.3f} audio s/s, "
          f"talkstream {result['talkstream_audio_s_per_wall_s']:.3f}")
    print(f"  throughput ratio (talkstream / official), median of rounds: {result['throughput_ratio']:.2f}x")
    print(f"  first audio ratio (official / talkstream p50), median of rounds: {result['ttfa_p50_ratio']:.1f}x")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", choices=["official", "talkstream"])
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (official: intra-op; talkstream: per worker, 0 = its own choice)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-frames", type=int, default=None, help="each request's frames at most")
    ap.add_argument("--to-the-cap", action="store_true", help="every request makes exactly --max-frames frames")
    ap.add_argument("--quantize", default=None, help="talkstream side: as `talkstream serve --quantize`")
    ap.add_argument("--dtype", default="auto", help="talkstream side: as TALKSTREAM_DTYPE")
    ap.add_argument("--label", default="", help="the workload, for the report")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per side in its process; the median is kept")
    ap.add_argument("--report", nargs="+", type=Path, metavar="JSON",
                    help="per round: the official side's result, then Talkstream's")
    args = ap.parse_args()
    if args.to_the_cap and args.max_frames is None:
        ap.error("--to-the-cap needs --max-frames")
    if args.report:
        runs = [json.loads(p.read_text().strip().splitlines()[-1]) for p in args.report]
        print(json.dumps(report(runs[0::2], runs[1::2], args.label)))
    elif args.side == "official":
        threads = args.threads or os.cpu_count() or 1
        print(json.dumps(run_official(args.checkpoint, threads, args.repeat, args.requests, args.max_frames,
                                      args.to_the_cap)))
    else:
        print(json.dumps(asyncio.run(_talkstream(args.checkpoint, args.threads, args.repeat, args.requests,
                                                 args.max_frames, args.quantize, args.dtype, args.to_the_cap))))


if __name__ == "__main__":
    main()

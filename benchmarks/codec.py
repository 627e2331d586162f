"""Streaming codec decode, torch ops against the native kernels, alternating in one process (one thread).

For each (streams, frames per call) it times `decode_streams` on the embedded tiny codec with both paths, rounds
interleaved so that a busy host hits both alike, and checks that the two agree with the one-shot decode.
Usage: .venv/bin/python -m benchmarks.codec [--rounds N] [--json]
"""

import argparse
import json
import statistics
import sys
import time

import torch

from engine.config import default_cache_dir
from engine.tiny import ensure_tiny
from output_builder.codecs.native import load_native
from output_builder.codecs.qwen12hz import Qwen12HzCodec

SHAPES = [(16, 8), (32, 8), (32, 1), (16, 1), (1, 1), (1, 8)]


def timed(codec: Qwen12HzCodec, streams: int, frames: int, calls: int) -> list[float]:
    states = [codec.open_stream() for _ in range(streams)]
    gen = torch.Generator().manual_seed(streams * 100 + frames)
    out = []
    for _ in range(calls):
        jobs = [(s, torch.randint(0, 2048, (16, frames), generator=gen)) for s in states]
        t0 = time.thread_time()  # CPU time of this thread: a stolen core does not count
        codec.decode_streams(jobs)
        out.append(time.thread_time() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    codec = Qwen12HzCodec.from_pretrained(ensure_tiny(default_cache_dir()) / "speech_tokenizer")
    native = load_native()
    if native is None:
        sys.exit("this install has no native kernels (setup.py builds them; see the log)")
    codes = torch.randint(0, 2048, (1, 16, 40), generator=torch.Generator().manual_seed(0))
    full = codec.decode(codes)[0]
    results: dict[str, object] = {}
    with torch.inference_mode():
        for name, kernels in (("torch", None), ("native", native)):
            codec.use_native(kernels)
            stream = codec.open_stream()
            pieces = [codec.decode_streams([(stream, codes[0, :, a:b])])[0] for a, b in ((0, 1), (1, 9), (9, 40))]
            results[f"{name}_max_error_vs_one_shot"] = (torch.cat(pieces) - full).abs().max().item()
        for streams, frames in SHAPES:
            times: dict[str, list[float]] = {"torch": [], "native": []}
            for _ in range(args.rounds):
                for name, kernels in (("torch", None), ("native", native)):
                    codec.use_native(kernels)
                    times[name] += timed(codec, streams, frames, 3)[1:]  # the first call of a round warms up
            t, n = statistics.median(times["torch"]) * 1e3, statistics.median(times["native"]) * 1e3
            results[f"{streams}x{frames}"] = {"torch_ms": round(t, 2), "native_ms": round(n, 2),
                                              "speedup": round(t / n, 2)}
            print(f"{streams:3d} streams x {frames} frames: torch {t:7.2f} ms  native {n:7.2f} ms  "
                  f"({t / n:.2f}x; {n / (streams * frames):.3f} ms per frame)")
    print(f"max error vs one-shot: torch {results['torch_max_error_vs_one_shot']:.1e}, "
          f"native {results['native_max_error_vs_one_shot']:.1e}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

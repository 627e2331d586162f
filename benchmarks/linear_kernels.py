"""The Talker's 28-layer projection stack at a checkpoint size, per kernel and batch rows, alternating in one process.

  .venv/bin/python -m benchmarks.linear_kernels [--size 0.6b|1.7b|tiny] [--rows 1,2,3,4,8,16] [--threads 2] [--json]

Times q/k/v (fused), o, gate/up (fused) and down of 28 layers at random weights for `rows` requests of one row each,
with F.linear (MKL), oneDNN on the packed copy, and int8 (`Int8Linear`: `--quantize int8`), and prints the median
of --rounds. It shows the choice `PackedLinear` makes (MKL below 4 rows, oneDNN from 4): MKL's float32 GEMM
switches kernels at 4 rows and its time then doubles.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.tiny import SIZES, sized
from talker.models.qwen3_tts.linear import Int8Linear, PackedLinear

LAYERS = 28


def shapes(size: str) -> list[tuple[int, int]]:
    """[(N, K)] of one layer's four projections."""
    t, _, _ = sized(size)
    h, d, i = t["hidden_size"], t["head_dim"], t["intermediate_size"]
    hq, hkv = t["num_attention_heads"], t["num_key_value_heads"]
    return [((hq + 2 * hkv) * d, h), (h, hq * d), (2 * i, h), (h, i)]


def onednn(p: PackedLinear) -> Callable[[torch.Tensor], torch.Tensor]:
    """The packed copy's kernel at any number of rows (PackedLinear itself takes it from 4)."""
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, p._packed, None, "none", [], "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="0.6b", choices=list(SIZES))
    p.add_argument("--rows", default="1,2,3,4,8,16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(LAYERS) for n, k in shapes(args.size)]
    with torch.inference_mode():
        kernels: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]] = {
            "mkl": [lambda x, w=w: F.linear(x, w) for w in weights],  # type: ignore[misc]
            "onednn_packed": [onednn(PackedLinear(w)) for w in weights],
            "int8": [Int8Linear(w) for w in weights],
        }
        results = {}
        for rows in (int(r) for r in args.rows.split(",")):
            # one request per row ([rows, 1, K]): a decode step's batch
            inputs = [torch.randn(rows, 1, w.shape[1], generator=gen) for w in weights]
            times: dict[str, list[float]] = {name: [] for name in kernels}
            for _ in range(args.rounds + 1):  # the first round warms up
                for name, layer in kernels.items():
                    start = time.perf_counter()
                    for f, x in zip(layer, inputs, strict=True):
                        f(x)
                    times[name].append(time.perf_counter() - start)
            ms = {name: round(statistics.median(t[1:]) * 1e3, 1) for name, t in times.items()}
            results[rows] = ms
            print(f"{rows:3d} rows: " + "  ".join(f"{name} {v:6.1f} ms" for name, v in ms.items()), flush=True)
    print(f"({LAYERS} layers at the {args.size} sizes, {args.threads} threads, median of {args.rounds} rounds)")
    if args.json:
        print(json.dumps({"size": args.size, "threads": args.threads, "ms_per_stack": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

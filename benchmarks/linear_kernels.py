"""The Talker's 28-layer projection stack at a checkpoint size, per kernel and batch rows, alternating in one process.

  .venv/bin/python -m benchmarks.linear_kernels [--size 0.6b|1.7b|tiny] [--rows 1,2,3,4,8,16] [--threads 2] [--json]

Times q/k/v (fused), o, gate/up (fused) and down of 28 layers at random weights for `rows` requests of one row each,
with F.linear (MKL), oneDNN on the packed copy, and int8 (`Int8Linear`: `--quantize int8`), and prints the median
of --rounds. It shows the choice `PackedLinear` makes (MKL below 4 rows, oneDNN from 4): MKL's float32 GEMM
switches kernels at 4 rows and its time then doubles.

`--int8-kernels` adds torch's other int8 paths on the same weights (per output channel, symmetric), for the choice
of `Int8Linear`'s kernel: weight-only (`aten._weight_int8pack_mm`, what torchao's weight-only config calls on a
CPU), weight-only through Inductor (`F.linear` of the int8 weight cast in the graph, times its scales, compiled),
dynamic activations through oneDNN (`onednn.qlinear_pointwise`, what Inductor's x86 quantizer lowers to) and
through `aten._int_mm` (torchao's dynamic-activation path). Each kernel's weight bytes per second are printed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

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


def int8_kernels(weights: list[torch.Tensor]) -> dict[str, list[Callable[[torch.Tensor], torch.Tensor]]]:
    """torch's other int8 linears on `weights` quantized as Int8Linear quantizes them."""
    scales = [w.abs().amax(dim=1).clamp(min=1e-12) / 127.0 for w in weights]
    qweights = [torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8) for w, s in zip(weights, scales,
                                                                                          strict=True)]

    def cast(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return F.linear(x, q.to(x.dtype)) * s

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)  # a graph per shape
    inductor = torch.compile(cast, dynamic=False)

    def weight_only(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), q, s)

    def quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = x.reshape(-1, x.shape[-1])
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 127.0  # [M, 1]
        return torch.round(rows / scale).to(torch.int8), scale

    def onednn_int8(q: torch.Tensor, s: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        packed, zero = torch.ops.onednn.qlinear_prepack(q, None), torch.zeros(q.shape[0], dtype=torch.long)

        def f(x: torch.Tensor) -> torch.Tensor:
            rows = x.reshape(-1, x.shape[-1])
            # uint8 around 128 in 7 bits (as fbgemm's reduce_range: no int16 saturation without VNNI), one range
            # for the call (oneDNN's per-tensor)
            scale = rows.abs().amax().clamp(min=1e-30) / 63.0
            qx = (torch.round(rows / scale) + 128).to(torch.uint8)
            return torch.ops.onednn.qlinear_pointwise(qx, float(scale), 128, packed, s, zero, None, 1.0, 0,
                                                      torch.float32, "none", [], "")
        return f

    def int_mm(q: torch.Tensor, s: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        qt = q.t()  # [K, N], a column-major view

        def f(x: torch.Tensor) -> torch.Tensor:
            qx, scale = quantized_rows(x)
            return torch._int_mm(qx, qt).float() * scale * s
        return f

    return {
        "int8_weight_only": [partial(weight_only, q=q, s=s) for q, s in zip(qweights, scales, strict=True)],
        "int8_weight_only_inductor": [partial(inductor, q=q, s=s) for q, s in zip(qweights, scales, strict=True)],
        "int8_onednn": [onednn_int8(q, s) for q, s in zip(qweights, scales, strict=True)],
        "int8_int_mm": [int_mm(q, s) for q, s in zip(qweights, scales, strict=True)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="0.6b", choices=list(SIZES))
    p.add_argument("--rows", default="1,2,3,4,8,16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--int8-kernels", action="store_true", help="also torch's other int8 linears (slow ones too)")
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
            **(int8_kernels(weights) if args.int8_kernels else {}),
        }
        float_bytes = sum(w.numel() * 4 for w in weights)
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
            gbs = {name: (float_bytes if name in ("mkl", "onednn_packed") else float_bytes // 4) / (v * 1e6)
                   for name, v in ms.items()}
            print(f"{rows:3d} rows: " + "  ".join(f"{name} {v:6.1f} ms ({gbs[name]:.1f} GB/s)"
                                                  for name, v in ms.items()), flush=True)
    print(f"({LAYERS} layers at the {args.size} sizes, {args.threads} threads, median of {args.rounds} rounds)")
    if args.json:
        print(json.dumps({"size": args.size, "threads": args.threads, "ms_per_stack": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

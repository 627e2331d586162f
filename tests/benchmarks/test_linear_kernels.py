"""`python -m benchmarks.linear_kernels`: every kernel is timed at every row count, and all three compute the same
projection (the benchmark would otherwise compare kernels doing different work)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from benchmarks import linear_kernels
from talker.models.qwen3_tts.linear import Int8Linear, PackedLinear


def test_it_times_each_kernel_at_each_row_count(capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    try:
        assert linear_kernels.main(["--size", "tiny", "--rows", "1,4", "--rounds", "1", "--threads", "1",
                                    "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["size"] == "tiny"
    assert set(out["ms_per_stack"]) == {"1", "4"}
    for ms in out["ms_per_stack"].values():
        assert set(ms) == {"mkl", "onednn_packed", "int8"} and all(v > 0 for v in ms.values())


def test_the_kernels_compute_the_same_projection() -> None:
    g = torch.Generator().manual_seed(0)
    for n, k in linear_kernels.shapes("0.6b"):
        w = torch.randn(n, k, generator=g) * 0.02
        x = torch.randn(4, 1, k, generator=g)
        want = F.linear(x, w)
        torch.testing.assert_close(linear_kernels.onednn(PackedLinear(w))(x), want, rtol=1e-5, atol=1e-5)
        assert float((Int8Linear(w)(x) - want).norm() / want.norm()) < 0.02


@pytest.mark.filterwarnings(r"ignore::DeprecationWarning:torch(\.|$)")  # the compiler on torch's own parts
def test_the_other_int8_kernels_compute_the_same_projection_within_int8s_error() -> None:
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g) * 0.02 for n, k in linear_kernels.shapes("tiny")]
    kernels = linear_kernels.int8_kernels(weights)
    assert set(kernels) == {"int8_weight_only", "int8_weight_only_inductor", "int8_onednn", "int8_int_mm"}
    for rows in (1, 4):
        for i, w in enumerate(weights):
            x = torch.randn(rows, 1, w.shape[1], generator=g)
            want = F.linear(x, w).reshape(rows, -1)
            for name, layer in kernels.items():
                got = layer[i](x).reshape(rows, -1)
                assert float((got - want).norm() / want.norm()) < 0.05, (name, rows, w.shape)  # 7-bit activations: ~3%

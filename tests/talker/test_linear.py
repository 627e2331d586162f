"""Projections: full precision as F.linear bound to its weight, and int8 weights (`Int8Linear`) on both kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from talker.models.qwen3_tts.linear import Int8Linear, dense, projection

KERNELS = [pytest.param(False, id="fbgemm-dynamic"), pytest.param(True, id="weight-only")]


def data(n: int = 96, k: int = 64, m: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g), torch.randn(m, k, generator=g))


def test_dense_and_projection_of_a_linear_are_f_linear_exactly() -> None:
    w, b, x = data()
    lin = nn.Linear(64, 96)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    assert torch.equal(projection(lin)(x), F.linear(x, w, b))
    assert torch.equal(dense(w)(x), F.linear(x, w))
    with pytest.raises(TypeError, match="not a linear projection"):
        projection(nn.ReLU())


@pytest.mark.parametrize("weight_only", KERNELS)
def test_int8_linear_is_close_to_full_precision(weight_only: bool) -> None:
    """Within int8's error (1-2 % of the output's scale), with and without bias, for any leading shape."""
    w, b, x = data()
    for bias in (None, b):
        q = Int8Linear(w, bias, weight_only=weight_only)
        ref = F.linear(x, w, bias)
        err = (q(x) - ref).norm() / ref.norm()
        assert err < 0.02, f"relative error {err:.4f}"
        assert q(x.view(5, 1, 64)).shape == (5, 1, 96)
        assert torch.equal(q(x.view(5, 1, 64)).view(5, 96), q(x))


@pytest.mark.parametrize("weight_only", KERNELS)
def test_a_rows_int8_result_does_not_depend_on_its_batch(weight_only: bool) -> None:
    """Bit for bit: alone, with other rows, and beside a row 1000x larger (one activation range for the whole
    input, as fbgemm has, would coarsen the small row's quantization)."""
    w, _, x = data()
    q = Int8Linear(w, weight_only=weight_only)
    together = q(x)
    loud = x.clone()
    loud[1:] *= 1000.0
    for i in range(x.shape[0]):
        assert torch.equal(q(x[i : i + 1])[0], together[i])
    assert torch.equal(q(loud)[0], together[0])


def test_int8_weights_take_a_quarter_of_the_bytes_and_a_zero_row_stays_zero() -> None:
    w, _, _ = data()
    q = Int8Linear(w)
    assert q.nbytes == 96 * 64 + 4 * 96
    assert torch.equal(q(torch.zeros(2, 64)), torch.zeros(2, 96))

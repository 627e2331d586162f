"""Projections: full precision as F.linear bound to its weight, packed for batches (`PackedLinear`), and int8 weights
(`Int8Linear`) on both kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from talker.models.qwen3_tts import linear
from talker.models.qwen3_tts.linear import Int8Linear, PackedLinear, dense, projection

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


class Calls(TorchDispatchMode):
    """The ops a call dispatches, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def packed_calls(p: PackedLinear, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    with Calls() as calls:
        out = p(x)
    return out, any("mkldnn._linear_pointwise" in name for name in calls.names)


@pytest.mark.bitexact
def test_a_single_requests_rows_and_small_batches_stay_f_linear_bit_for_bit() -> None:
    """[1, T, K] (one request, decode or prefill) and batches of up to 3 rows: what the official package computes."""
    w, b, _ = data(n=256, k=128)
    p = PackedLinear(w, b)
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 1, 128), (1, 9, 128), (1, 128), (2, 1, 128), (3, 1, 128), (3, 128)]:
        x = torch.randn(*shape, generator=g)
        out, packed = packed_calls(p, x)
        assert not packed, shape
        assert torch.equal(out, F.linear(x, w, b)), shape


@pytest.mark.parametrize("shape", [(4, 1, 128), (2, 2, 128), (5, 3, 128), (4, 128), (16, 128)])
def test_a_batch_of_four_rows_or_more_goes_through_the_packed_copy_and_stays_close(shape: tuple[int, ...]) -> None:
    w, b, _ = data(n=256, k=128)
    p = PackedLinear(w, b)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    x_strided = torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]  # a non-contiguous input too
    for inp in (x, x_strided):
        out, packed = packed_calls(p, inp)
        assert packed
        assert out.shape == (*shape[:-1], 256)
        torch.testing.assert_close(out, F.linear(inp, w, b), rtol=1e-5, atol=1e-6)
    assert torch.equal(projection(p)(x), p(x))


def test_packing_applies_to_large_float32_weights_on_the_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    big = torch.zeros(1024, linear.PACK_MIN_ELEMENTS // 1024)
    assert PackedLinear.applies(big)
    assert not PackedLinear.applies(big[:-1])  # below the size where the weight's bytes dominate
    assert not PackedLinear.applies(big.bfloat16())
    assert not PackedLinear.applies(torch.zeros(1024, 1024, device="meta"))
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert not PackedLinear.applies(big)


def test_a_packed_linear_keeps_its_weight_and_state_dict_names() -> None:
    w, b, _ = data(n=256, k=128)
    p = PackedLinear(w, b)
    assert set(p.state_dict()) == {"weight", "bias"}
    assert p.weight.data_ptr() == w.data_ptr() and torch.equal(p.bias, b)
    assert p.nbytes == 256 * 128 * 4

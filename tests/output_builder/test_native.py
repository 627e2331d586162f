"""The codec's native CPU kernels: equal to their torch definitions, cached, and optional."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from output_builder.codecs import native
from output_builder.codecs.native import NativeKernels, load_native

TOL = 2e-5


def snake_reference(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    return x + inv_beta[None, :, None] * torch.sin(x * alpha[None, :, None]).pow(2)


@pytest.mark.parametrize("shape", [(1, 4, 1920), (3, 8, 37), (2, 64, 5), (1, 1, 1)])
def test_snake_equals_torch(native_kernels: NativeKernels, shape: tuple[int, int, int]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen) * 3
    alpha, inv_beta = torch.rand(shape[1], generator=gen) + 0.2, torch.rand(shape[1], generator=gen) * 4
    got = native_kernels.snake(x, alpha, inv_beta, torch.empty_like(x))
    assert (got - snake_reference(x, alpha, inv_beta)).abs().max().item() <= TOL


def test_snake_writes_into_a_strided_slice(native_kernels: NativeKernels) -> None:
    x, alpha, inv_beta = torch.randn(2, 4, 50), torch.rand(4) + 0.5, torch.rand(4)
    buffer = torch.full((2, 4, 56), 7.0)
    native_kernels.snake(x, alpha, inv_beta, buffer[..., 6:])
    assert torch.equal(buffer[..., :6], torch.full((2, 4, 6), 7.0))
    assert (buffer[..., 6:] - snake_reference(x, alpha, inv_beta)).abs().max().item() <= TOL


# (batch, c_in, c_out, taps, dilation, length): register blocks, leftover channels, a time tail, 1x1 and dilated
CONVS = [(2, 4, 4, 7, 1, 64), (1, 4, 1, 7, 9, 50), (3, 8, 12, 2, 1, 33), (1, 16, 5, 3, 3, 17), (2, 6, 8, 1, 1, 7)]


@pytest.mark.parametrize("case", CONVS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("with_residual", [False, True])
def test_conv_equals_torch(native_kernels: NativeKernels, case: tuple[int, ...], with_residual: bool) -> None:
    b, c_in, c_out, taps, dilation, length = case
    gen = torch.Generator().manual_seed(length)
    x = torch.randn(b, c_in, length + (taps - 1) * dilation, generator=gen)
    weight, bias = torch.randn(c_out, c_in, taps, generator=gen), torch.randn(c_out, generator=gen)
    residual = torch.randn(b, c_out, length, generator=gen) if with_residual else None
    want = F.conv1d(x, weight, bias, dilation=dilation) + (residual if residual is not None else 0)
    got = native_kernels.conv(x, weight, bias, dilation, residual)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOL * 10


def test_conv_reads_a_strided_input_and_no_bias(native_kernels: NativeKernels) -> None:
    full = torch.randn(2, 4, 40)
    x = full[..., 3:]  # time contiguous, rows spaced 40 apart
    weight = torch.randn(4, 4, 3)
    got = native_kernels.conv(x, weight, None, 2, None)
    assert (got - F.conv1d(x, weight, dilation=2)).abs().max().item() <= TOL


def test_bad_tensors_are_refused(native_kernels: NativeKernels) -> None:
    x = torch.randn(1, 4, 10)
    with pytest.raises(ValueError, match="float32 CPU"):
        native_kernels.snake(x.double(), torch.ones(4), torch.ones(4), torch.empty(1, 4, 10))
    with pytest.raises(ValueError, match="one value per channel"):
        native_kernels.snake(x, torch.ones(3), torch.ones(3), torch.empty_like(x))
    with pytest.raises(ValueError, match="does not fit"):
        native_kernels.conv(x, torch.randn(4, 3, 3), None, 1, None)
    with pytest.raises(ValueError, match="residual"):
        native_kernels.conv(x, torch.randn(4, 4, 3), None, 1, torch.randn(1, 4, 9))
    assert not NativeKernels.accepts(x.transpose(1, 2))


def test_loading_leaves_the_process_floating_point_alone() -> None:
    """Linked with -ffast-math the library would switch on flush-to-zero for everyone (hypothesis notices)."""
    assert load_native() is not None
    tiny = np.array([1e-45], dtype=np.float32)  # a subnormal
    assert float((tiny * np.float32(1.0))[0]) > 0.0
    assert np.nextafter(np.float32(0), np.float32(1)) * np.float32(2) > 0


def test_an_install_without_the_library_runs_the_torch_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(native, "MODULE", "output_builder.codecs._no_such_kernels")
    with caplog.at_level(logging.WARNING, "talkstream.codec"):
        assert load_native() is None
    assert "torch path" in caplog.text

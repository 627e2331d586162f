"""The streaming decoder's convolution and SnakeBeta ops: fused native kernels where they apply, torch otherwise.

Both paths compute the same function; they differ in float rounding only (within 1e-5 of each other).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from output_builder.codecs.native import NativeKernels
from output_builder.codecs.qwen12hz_layers import CausalTransConv1d, SnakeBeta

_GEMM_MAX_INPUT = 65536  # input elements up to which the im2col GEMM beats conv1d (measured)


class Derived:
    """Per-layer tensors derived from weights (snake scales, transposed-conv weights), rebuilt on change."""

    def __init__(self) -> None:
        self._cache: dict[nn.Module, tuple[tuple[int, ...], tuple[Tensor, ...]]] = {}

    def get(self, layer: nn.Module, make: Callable[[], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
        key = tuple(v for p in layer.parameters() for v in (p.data_ptr(), p._version))
        hit = self._cache.get(layer)
        if hit is None or hit[0] != key:
            hit = self._cache[layer] = (key, make())
        return hit[1]


def snake_scales(act: SnakeBeta) -> tuple[Tensor, Tensor]:
    """e^alpha and 1 / (e^beta + 1e-9), each [1, C, 1], computed exactly as ``SnakeBeta.forward``."""
    alpha = act.alpha.exp()[None, :, None]
    return alpha, 1.0 / (act.beta.exp()[None, :, None] + 1e-9)


def trans_as_conv(layer: CausalTransConv1d, taps: int) -> tuple[Tensor, Tensor]:
    """ConvTranspose weight [C_in, C_out, K] -> conv1d weight [C_out * s, C_in, taps] and bias [C_out * s].

    Transposed-conv output t * s + j is ``sum_m W[:, :, m * s + j] . x[t - m]``; conv tap p reads
    x[t - (taps - 1) + p], so tap p holds offset m = taps - 1 - p.
    """
    weight, stride = layer.conv.weight, layer.stride
    c_in, c_out = weight.shape[0], weight.shape[1]
    weight = F.pad(weight, (0, taps * stride - weight.shape[-1]))  # [C_in, C_out, taps * s]
    weight = weight.unflatten(-1, (taps, stride)).flip(2)  # [C_in, C_out, taps (p), s (j)]
    weight = weight.permute(1, 3, 0, 2).reshape(c_out * stride, c_in, taps).contiguous()
    bias = layer.conv.bias if layer.conv.bias is not None else weight.new_zeros(c_out)
    return weight, bias.repeat_interleave(stride)


def conv_valid(x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int = 1, groups: int = 1) -> Tensor:
    """conv1d without padding in torch; small inputs run as an im2col GEMM (plain or depthwise).

    conv1d sends small inputs (a few frames) to slow unbatched kernels, dilated ones especially.
    """
    # x: [B, C_in, L]; weight: [C_out, C_in / groups, K] -> [B, C_out, L - (K - 1) * dilation]
    (b, c, length), (c_out, _, k) = x.shape, weight.shape
    t, (s0, s1, s2) = length - (k - 1) * dilation, x.stride()
    small = x.numel() <= _GEMM_MAX_INPUT
    if small and groups == 1:
        cols = x.as_strided((b, c, k, t), (s0, s1, dilation * s2, s2)).reshape(b, c * k, t)  # [B, C*K, T]
        flat = weight.reshape(c_out, c * k)
        if bias is None:
            return torch.matmul(flat, cols)
        if b == 1:
            return torch.addmm(bias[:, None], flat, cols[0])[None]
        # one GEMM over every row's columns: a batch of GEMMs a few columns wide runs far below the GEMM's rate
        out = torch.addmm(bias[:, None], flat, cols.transpose(0, 1).reshape(c * k, b * t))  # [C_out, B*T]
        return out.view(c_out, b, t).transpose(0, 1).contiguous()
    if small and groups == c == c_out:
        cols = x.as_strided((b, c, t, k), (s0, s1, s2, dilation * s2))  # cols: [B, C, T, K]
        out = torch.matmul(cols, weight.view(c, k, 1)).squeeze(-1)  # out: [B, C, T]
        return out if bias is None else out.add_(bias[:, None])
    return F.conv1d(x, weight, bias, dilation=dilation, groups=groups)


def _few_channels(weight: Tensor) -> bool:
    """Where the native conv beats torch's: few output channels (the kernel keeps 4 in registers while the taps
    stream by). With more, oneDNN's blocked GEMM wins, by 2x at 192-384 channels and 6x for a 96-channel 1x1
    (measured at Qwen3-TTS-12Hz-0.6B's codec sizes, docs/benchmarks.md); a real codec's last convs still qualify."""
    c_out, c_in = weight.shape[0], weight.shape[1]
    return c_out * c_in <= NATIVE_CONV_MAX_CHANNEL_PAIRS or c_out <= NATIVE_CONV_MAX_OUT


NATIVE_CONV_MAX_CHANNEL_PAIRS = 256  # 16 x 16 still wins (1.1x), 32 x 32 loses (0.84x)
NATIVE_CONV_MAX_OUT = 4  # 96 -> 1 wins 3x


class CodecOps:
    """Dispatches each op to the native kernels when they are loaded and accept the tensors."""

    def __init__(self) -> None:
        self.native: NativeKernels | None = None

    def snake(self, x: Tensor, alpha: Tensor, inv_beta: Tensor, out: Tensor | None = None) -> Tensor:
        """x + inv_beta * sin(alpha * x)^2, optionally written into ``out``. x: [B, C, T]; scales: [1, C, 1]."""
        if self.native is not None and self.native.accepts(x):
            return self.native.snake(x, alpha, inv_beta, out if out is not None else torch.empty_like(x))
        s = torch.mul(x, alpha)
        s.sin_().pow_(2)
        return torch.addcmul(x, s, inv_beta, out=out if out is not None else s)

    def conv(
        self, x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int = 1, groups: int = 1,
        residual: Tensor | None = None,
    ) -> Tensor:
        """Valid conv1d, plus ``residual`` when given. x: [B, C_in, L] -> [B, C_out, L - (K - 1) * dilation]."""
        length = x.shape[-1] - (weight.shape[-1] - 1) * dilation
        if (self.native is not None and groups == 1 and length >= self.native.LANES and _few_channels(weight)
                and self.native.accepts(x)):
            return self.native.conv(x, weight, bias, dilation, residual)
        if residual is not None and weight.shape[-1] == 1 and groups == 1:  # 1x1: one batched GEMM adds it
            out = torch.baddbmm(residual, weight[:, :, 0].expand(x.shape[0], -1, -1), x)
            return out if bias is None else out.add_(bias[:, None])
        out = conv_valid(x, weight, bias, dilation, groups)
        return out if residual is None else out.add_(residual)

    def run(self, conv: nn.Conv1d, x: Tensor, residual: Tensor | None = None) -> Tensor:
        # x: [B, C_in, L] -> [B, C_out, L - (K - 1) * dilation]
        return self.conv(x, conv.weight, conv.bias, conv.dilation[0], conv.groups, residual)

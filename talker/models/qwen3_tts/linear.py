"""Projections: the callables the decode loops apply to activations, in full precision or as int8 weights.

A projection is any `x [..., K] -> [..., N]` callable. Full precision is `F.linear` bound to its weight (a C call, no
module dispatch: the code predictor's loop applies ~30 of them per sub-step). `Int8Linear` keeps the weight as int8
per output channel and runs torch's own int8 kernels:
- CPU: fbgemm's dynamic-quantization linear (`quantized::linear_dynamic`, the kernel behind
  `torch.ao.nn.quantized.dynamic.Linear`): activations are quantized on the fly, int8 x int8 products in exact
  integer arithmetic.
- CUDA: `aten._weight_int8pack_mm` (weight-only int8: activations stay in their dtype).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Projection = Callable[[Tensor], Tensor]


def dense(weight: Tensor, bias: Tensor | None = None) -> Projection:
    return partial(F.linear, weight=weight, bias=bias)


def projection(module: nn.Module) -> Projection:
    """The projection a linear module applies, without the module call."""
    if isinstance(module, Int8Linear):
        return module.forward
    if isinstance(module, nn.Linear):
        return dense(module.weight, module.bias)
    raise TypeError(f"not a linear projection: {type(module).__name__}")


class Int8Linear(nn.Module):
    """`F.linear(x, weight, bias)` with the weight as int8, one scale per output channel (symmetric).

    Each row of x is quantized on its own (its own absolute maximum), so a row's result does not depend on the rows
    it is batched with. fbgemm quantizes the whole input with one range, so every row is scaled to an absolute
    maximum of 1 first, and a sentinel row holding +1 and -1 pins the range to [-1, 1] whatever the batch holds;
    the integer products are exact, and the row's scale is multiplied back afterwards.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, weight_only: bool | None = None) -> None:
        """weight_only: the CUDA kernel (the default off the CPU; it runs on the CPU too, slowly: for tests)."""
        super().__init__()
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [N]
        qweight = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)  # [N, K]
        self.bias = None if bias is None else bias.detach().clone()
        self.on_cpu = weight.device.type == "cpu" if weight_only is None else not weight_only
        if self.on_cpu:
            self._packed = _fbgemm_pack(qweight, scales)
        else:
            self._qweight, self._scales = qweight, scales.to(weight.dtype)
        self._sentinel = torch.zeros(1, self.in_features, dtype=torch.float32, device=weight.device)
        self._sentinel[0, 0] = 1.0
        if self.in_features > 1:
            self._sentinel[0, 1] = -1.0

    @property
    def nbytes(self) -> int:
        return self.out_features * self.in_features + 4 * self.out_features

    def forward(self, x: Tensor) -> Tensor:
        # x: [..., K] -> [..., N]
        shape = x.shape
        rows = x.reshape(-1, self.in_features)  # [M, K]
        out = self._cpu(rows) if self.on_cpu else torch._weight_int8pack_mm(rows, self._qweight, self._scales)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*shape[:-1], self.out_features)

    def _cpu(self, rows: Tensor) -> Tensor:
        # rows: [M, K] float32 -> [M, N]
        scale = torch.linalg.vector_norm(rows, float("inf"), dim=1, keepdim=True).clamp_(min=1e-30)  # [M, 1]: max |x|
        unit = torch.cat((rows / scale, self._sentinel))  # [M + 1, K], every row within [-1, 1]
        out = torch.ops.quantized.linear_dynamic(unit, self._packed, True)  # [M + 1, N]
        return out[:-1].mul_(scale)


def _fbgemm_pack(qweight: Tensor, scales: Tensor) -> object:
    zero = torch.zeros(qweight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # quantized tensors are deprecated as a user-facing type (pytorch#184982); fbgemm's packing still takes one
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        q = torch._make_per_channel_quantized_tensor(qweight, scales.double(), zero, 0)
    return torch.ops.quantized.linear_prepack(q, None)

"""Projections: the callables the decode loops apply to activations, in full precision or as int8 weights.

A projection is any `x [..., K] -> [..., N]` callable. Full precision is `F.linear` bound to its weight (a C call, no
module dispatch: the code predictor's loop applies ~30 of them per sub-step). `PackedLinear` adds, on the CPU, a
copy of a large weight in oneDNN's blocked layout for batches of 4 or more rows. `Int8Linear` keeps the
weight as int8 per output channel and runs torch's own int8 kernels:
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
    if isinstance(module, (Int8Linear, PackedLinear)):
        return module.forward
    if isinstance(module, nn.Linear):
        return dense(module.weight, module.bias)
    raise TypeError(f"not a linear projection: {type(module).__name__}")


# Packing pays where the weight's bytes dominate the call (the real sizes' layers: 1-6 M elements); tiny models stay
# on F.linear alone. The layout is chosen for this many rows; measured at 0.6B sizes it serves 4 to 64 rows alike.
PACK_MIN_ELEMENTS = 1 << 18
PACKED_MIN_ROWS = 4
PACK_HINT_ROWS = 16


class PackedLinear(nn.Module):
    """`F.linear(x, weight, bias)`, with batches of PACKED_MIN_ROWS or more rows through oneDNN's blocked copy.

    Why: MKL's float32 GEMM (behind F.linear) switches kernels at 4 rows, and at the 0.6B sizes 4 rows then take
    twice the time of 3 (28 Talker layers on 2 cores: 120 ms against 70); oneDNN on a prepacked weight takes 73 ms
    for 4 rows and 110 ms for 16. What stays on F.linear, bit for bit: a single request's rows (`[1, T, K]`, decode
    or prefill), so one request alone computes what the official package computes, and batches of up to 3 rows.
    Inputs are `[B, T, K]` or `[B, K]` (B requests); the weight (and its state-dict name) is kept, the packed copy
    is extra memory.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_HINT_ROWS)

    @staticmethod
    def applies(weight: Tensor) -> bool:
        return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.numel() >= PACK_MIN_ELEMENTS
                and torch.backends.mkldnn.is_available())

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()  # the packed copy's size (blocked, unpadded here)

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, (T,) K] -> [B, (T,) N]; several requests' rows, 4 or more in all, through the packed copy
        if x.shape[0] > 1 and x.dim() <= 3 and x.numel() >= PACKED_MIN_ROWS * x.shape[-1]:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


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
            self.packed = _fbgemm_pack(qweight, scales)  # fbgemm's int8 weight
        else:
            self._qweight, self._scales = qweight, scales.to(weight.dtype)
        # [1, K]: pins fbgemm's input range to [-1, 1]
        self.sentinel = torch.zeros(1, self.in_features, dtype=torch.float32, device=weight.device)
        self.sentinel[0, 0] = 1.0
        if self.in_features > 1:
            self.sentinel[0, 1] = -1.0

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
        unit = torch.cat((rows / scale, self.sentinel))  # [M + 1, K], every row within [-1, 1]
        out = torch.ops.quantized.linear_dynamic(unit, self.packed, True)  # [M + 1, N]
        return out[:-1].mul_(scale)


def _fbgemm_pack(qweight: Tensor, scales: Tensor) -> object:
    zero = torch.zeros(qweight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # quantized tensors are deprecated as a user-facing type (pytorch#184982); fbgemm's packing still takes one
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        q = torch._make_per_channel_quantized_tensor(qweight, scales.double(), zero, 0)
    return torch.ops.quantized.linear_prepack(q, None)

"""A projection inside a static program (talker/models/qwen3_tts/static.py): its result for a row is the one the row
gets alone, whatever the bucket and the rows beside it.

- A small CPU weight: products and sums the compiler writes itself, a row at a time (a library call costs more than
  the arithmetic, and a library GEMM's result for a row changes with the rows beside it).
- A large float32 CPU weight: oneDNN's linear on a copy prepacked once for 16 rows, as a registered op
  (`static_ops.project`): on that layout its sums run in one order whatever the row count of two or more (MKL's
  and oneDNN's on a layout for one row take a matrix-vector kernel for a single row, which sums in another order).
  A row alone goes as two copies of itself: with AVX-512 (and K over 1024) oneDNN sums even the prepacked layout's
  single row in another order.
- An int8 CPU weight (`--quantize int8`): the arithmetic of `linear.Int8Linear` with its steps split: each row scaled
  to an absolute maximum of 1 and the sentinel row appended in the graph (fused with the ops around them), fbgemm's
  dynamic int8 linear as the one library call, the row's scale multiplied back in the graph.
- CUDA: `F.linear` in the graph, or an int8 weight's own forward as a registered op.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from talker import static_ops
from talker.models.qwen3_tts.linear import Int8Linear, PackedLinear, Projection

PACK_ROWS_HINT = 16
LOOPS_MAX_ELEMENTS = 1 << 15  # a CPU weight this small is applied by the compiler's loops, larger ones by oneDNN


class Linear:
    """x [..., K] -> [..., N]: a registered library call (`key` >= 0; `sentinel` set: int8 rows around it), or in
    the graph (`weight`): the compiler's loops (`loops`, CPU) or `F.linear` (CUDA)."""

    __slots__ = ("bias", "key", "loops", "out", "sentinel", "weight")

    def __init__(self, key: int, out: int, weight: Tensor | None = None, bias: Tensor | None = None,
                 sentinel: Tensor | None = None) -> None:
        self.key, self.out, self.weight, self.bias, self.sentinel = key, out, weight, bias, sentinel
        self.loops = key < 0 and weight is not None and weight.device.type == "cpu"
        if self.loops:  # [K, N]: the loops run along N, summing over K (no horizontal sum per output)
            assert weight is not None
            self.weight = weight.t().contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        if self.sentinel is not None:
            return self._int8(x)
        if self.key >= 0:
            return torch.ops.talkstream.project(x, self.key, self.out)
        assert self.weight is not None
        return linear_loops(x, self.weight, self.bias) if self.loops else F.linear(x, self.weight, self.bias)

    def _int8(self, x: Tensor) -> Tensor:
        # x: [..., K]; the rows as Int8Linear._cpu makes them, so the library sees every row within [-1, 1]
        assert self.sentinel is not None
        scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)  # [..., 1]: max |x| of each row
        unit = torch.cat(((x / scale).reshape(-1, x.shape[-1]), self.sentinel))  # [M + 1, K]
        out = torch.ops.talkstream.project(unit, self.key, self.out)[:-1]  # [M, N]
        out = out.view(*x.shape[:-1], self.out) * scale
        return out if self.bias is None else out + self.bias


def linear_loops(x: Tensor, weight_t: Tensor, bias: Tensor | None) -> Tensor:
    """x: [..., K], weight_t: [K, N] -> [..., N], one row at a time."""
    out = (x.unsqueeze(-1) * weight_t).sum(-2)
    return out if bias is None else out + bias


def static_linear(p: Projection | nn.Module) -> Linear:
    """The static program's form of one of the model's projections (a module, a bound forward or a partial)."""
    owner = getattr(p, "__self__", p)
    if isinstance(owner, Int8Linear):
        return _int8(owner)
    packed: object | None = None
    if isinstance(owner, (PackedLinear, nn.Linear)):
        weight, bias = _plain(owner.weight), _plain(owner.bias)
        packed = owner._packed if isinstance(owner, PackedLinear) else None
    elif isinstance(p, partial):
        weight, bias = _plain(p.keywords["weight"]), _plain(p.keywords.get("bias"))
    else:
        raise TypeError(f"not a projection: {type(p).__name__}")
    assert weight is not None
    if weight.device.type != "cpu" or weight.numel() < LOOPS_MAX_ELEMENTS:
        return Linear(-1, weight.shape[0], weight, bias)
    if packed is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS_HINT)
    return Linear(static_ops.register(partial(_onednn, packed=packed, bias=bias)), weight.shape[0])


def _onednn(x: Tensor, packed: object, bias: Tensor | None) -> Tensor:
    rows = x.reshape(-1, x.shape[-1])  # [M, K]
    if rows.shape[0] == 1:  # AVX-512: oneDNN sums a row alone in another order than a row among others (K > 1024)
        two = torch.ops.mkldnn._linear_pointwise(torch.cat((rows, rows)), packed, bias, "none", [], "")  # [2, N]
        return two[:1].view(*x.shape[:-1], two.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _int8(q: Int8Linear) -> Linear:
    if not q.on_cpu:
        return Linear(static_ops.register(q.forward), q.out_features)
    key = static_ops.register(partial(_fbgemm, packed=q.packed))
    return Linear(key, q.out_features, bias=q.bias, sentinel=q.sentinel)


def _fbgemm(unit: Tensor, packed: object) -> Tensor:
    return torch.ops.quantized.linear_dynamic(unit, packed, True)


def _plain(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()

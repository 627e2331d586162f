"""The calls a static step makes through its own ops, so that `torch.compile` keeps them whole.

- `project(x, key, out)`: a projection registered here (`register`), e.g. oneDNN's linear on a weight prepacked once
  (its result for a row does not depend on how many rows share the call, where MKL's does) or the int8 kernel. The
  compiler sees an op with a known output shape, not the opaque packed weight it could not trace.
- `slot_attention(q, k, v, n)`: each row attends to the first n[i] positions of its own cache rows, one
  scaled-dot-product call per row (a row's n[i] is known on the host: the CPU reads it for free). So a row reads
  only what it has written, at any batch bucket, and its result is the one it gets alone.
- `uniforms(seeds, frames, draws)`: the sampler's counter-based uniforms (talker/sampler.py). Its integer hash
  reuses every value twice per stage; inlined by the compiler into one expression it grows exponentially (one
  kernel took 20 s to compile), so it runs as the eager ops it is.
- `top_candidates(logits, k)`: a draw's k best logits, sorted (talker/sampler.py): on the CPU a numpy quickselect
  and a small sort, where torch's topk (what the compiler would call) took 380 us for 16 rows of 2,048.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from talker.sampler import step_uniforms, top_candidates

_PROJECTIONS: list[Callable[[Tensor], Tensor]] = []
_INDEXED: list[tuple[list[Callable[[Tensor], Tensor]], int]] = []


def register(fn: Callable[[Tensor], Tensor]) -> int:
    """A projection `x [..., K] -> [..., N]` the static step calls by key."""
    _PROJECTIONS.append(fn)
    return len(_PROJECTIONS) - 1


@torch.library.custom_op("talkstream::project", mutates_args=())
def project(x: Tensor, key: int, out: int) -> Tensor:
    return _PROJECTIONS[key](x)


@project.register_fake
def _project_shape(x: Tensor, key: int, out: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], out))


def register_indexed(fns: list[Callable[[Tensor], Tensor]], first: int = 0) -> int:
    """Projections the static step picks with a 0-d tensor (`project_at`): fns[i] answers index first + i."""
    _INDEXED.append((fns, first))
    return len(_INDEXED) - 1


@torch.library.custom_op("talkstream::project_at", mutates_args=())
def project_at(x: Tensor, key: int, index: Tensor, out: int) -> Tensor:
    fns, first = _INDEXED[key]
    return fns[int(index) - first](x)  # a CPU tensor: reading it costs nothing


@project_at.register_fake
def _project_at_shape(x: Tensor, key: int, index: Tensor, out: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], out))


@torch.library.custom_op("talkstream::slot_attention", mutates_args=("cache_k", "cache_v"))
def slot_attention(q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, layer: int, at: Tensor,
                   n: Tensor) -> Tensor:
    """Writes each row's k/v [B, Hkv, D] at position at[i] of slot i of the layer's cache ([L, S, Hkv, T, D]),
    then q: [B, Hq, D] attends to the row's first n[i] positions (0: an idle row, left zero) -> [B, Hq, D]."""
    b = q.shape[0]
    ck, cv = cache_k[layer, :b], cache_v[layer, :b]  # [B, Hkv, T, D]
    rows = torch.arange(b)
    ck[rows, :, at] = k
    cv[rows, :, at] = v
    out = torch.zeros_like(q)
    for i, length in enumerate(n.tolist()):
        if length:
            row = F.scaled_dot_product_attention(q[i : i + 1, :, None], ck[i : i + 1, :, :length],
                                                 cv[i : i + 1, :, :length], enable_gqa=True)  # [1, Hq, 1, D]
            out[i] = row[0, :, 0]
    return out


@slot_attention.register_fake
def _slot_attention_shape(q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, layer: int, at: Tensor,
                          n: Tensor) -> Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("talkstream::uniforms", mutates_args=())
def uniforms(seeds: Tensor, frames: Tensor, draws: int) -> Tensor:
    return step_uniforms(seeds, frames, draws)


@uniforms.register_fake
def _uniforms_shape(seeds: Tensor, frames: Tensor, draws: int) -> Tensor:
    return seeds.new_empty((seeds.shape[0], draws), dtype=torch.float32)


@torch.library.custom_op("talkstream::top_candidates", mutates_args=())
def candidates(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    values, ids = top_candidates(logits, k)  # [B, k] each, descending
    return values.contiguous(), ids.contiguous()


@candidates.register_fake
def _candidates_shape(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    shape = (*logits.shape[:-1], k)
    return logits.new_empty(shape), logits.new_empty(shape, dtype=torch.long)

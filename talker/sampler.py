"""Batched sampling on the device with per-row parameters and per-request seeds.

Randomness is counter-based: the noise for (seed, frame, draw, token) is a hash of those integers, so a request's
audio does not depend on which other requests share its batch, on the batch order, or on the device. A row samples
by the exponential race (argmax of p / E with E ~ Exp(1)), which draws exactly from p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
_M16 = 0xFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    # (x * c) mod 2**32 without int64 overflow: x, c < 2**32
    lo = (x & _M16) * c
    hi = ((x >> 16) * c) & _M16
    return (lo + (hi << 16)) & _M32


def _mix32(x: Tensor) -> Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def uniform_noise(seeds: Tensor, frames: Tensor, draw: int, tokens: Tensor) -> Tensor:
    """seeds, frames: [B] int64; tokens: [B, N] int64 -> u in (0, 1): [B, N] float32."""
    h = _mix32((seeds & _M32) ^ _mul32(frames & _M32, 0x9E3779B1))
    h = _mix32(h ^ ((draw * 0x27D4EB2F) & _M32))
    x = _mix32(h[:, None] ^ _mul32(tokens & _M32, 0x165667B1))
    return ((x >> 8).float() + 0.5) * (1.0 / (1 << 24))


@dataclass(frozen=True, slots=True)
class RowParams:
    """Sampling parameters of one batch, stacked once when the batch changes."""

    temperature: Tensor  # [B, 1]
    top_k: Tensor  # [B] (vocab size when disabled)
    top_p: Tensor  # [B, 1]
    greedy: Tensor  # [B] bool
    seeds: Tensor  # [B] int64
    kmax: int  # candidates kept per row: max(top_k)
    all_greedy: bool

    @classmethod
    def stack(
        cls, temperature: Sequence[float], top_k: Sequence[int], top_p: Sequence[float],
        seeds: Sequence[int], vocab: int, device: torch.device,
    ) -> RowParams:
        ks = [k if 0 < k < vocab else vocab for k in top_k]
        greedy = [t == 0.0 for t in temperature]
        return cls(
            temperature=torch.tensor([max(t, 1e-5) for t in temperature], device=device)[:, None],
            top_k=torch.tensor(ks, device=device),
            top_p=torch.tensor(top_p, device=device)[:, None],
            greedy=torch.tensor(greedy, device=device),
            seeds=torch.tensor(seeds, dtype=torch.long, device=device),
            kmax=max(ks) if ks else 1,
            all_greedy=all(greedy),
        )


def sample(logits: Tensor, p: RowParams, frames: Tensor, draw: int) -> Tensor:
    """logits: [B, V] float, frames: [B] int64 -> tokens: [B] int64."""
    logits = logits.float()
    best = logits.argmax(dim=-1)
    if p.all_greedy:
        return best
    # 1. top-k candidates, scaled by temperature: [B, K]
    values, idx = logits.topk(p.kmax, dim=-1)
    rank = torch.arange(p.kmax, device=logits.device)
    values = (values / p.temperature).masked_fill(rank[None, :] >= p.top_k[:, None], float("-inf"))
    probs = values.softmax(dim=-1)
    # 2. top-p: keep a candidate while the mass before it is below p (the first one always stays)
    before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill(before >= p.top_p, 0.0)
    # 3. exponential race with counter-based noise keyed by token id
    race = probs / -torch.log(uniform_noise(p.seeds, frames, draw, idx))
    chosen = idx.gather(1, race.argmax(dim=-1, keepdim=True))[:, 0]
    return torch.where(p.greedy, best, chosen)


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: Tensor) -> Tensor:
    """As in HF: seen tokens' logits are divided by the penalty when positive, multiplied when negative.

    logits: [B, V], seen: [B, V] bool, penalty: [B, 1]
    """
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)

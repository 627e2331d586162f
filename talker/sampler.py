"""Batched sampling on the device with per-row parameters and per-request seeds.

Randomness is counter-based: a row's uniform number for (seed, frame, draw) is a hash of those integers, so a
request's random draws do not depend on which other requests share its batch or on the batch order. (Its logits
can: a step's float arithmetic may round differently in another batch on some CPUs, as in every batched server; the
same batches give the same bits.) A row samples by inverse CDF over its top-k candidates, so one uniform per row and
draw is all it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
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


def step_uniforms(seeds: Tensor, frames: Tensor, draws: int) -> Tensor:
    """seeds, frames: [B] int64 -> u in (0, 1): [B, draws] float32, one per row and draw of this frame."""
    h = _mix32((seeds & _M32) ^ _mul32(frames & _M32, 0x9E3779B1))
    d = _mul32(torch.arange(draws, device=seeds.device), 0x27D4EB2F)
    x = _mix32(_mix32(h[:, None] ^ d[None, :]))
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
    any_greedy: bool = True
    uniform_k: bool = False  # every row keeps kmax candidates: no per-row top-k mask needed
    any_top_p: bool = True  # some row has top_p < 1

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
            any_greedy=any(greedy),
            uniform_k=len(set(ks)) <= 1,
            any_top_p=any(q < 1.0 for q in top_p),
        )


def top_candidates(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest logits of each row, sorted descending. logits: [B, V] -> values, ids: [B, k]."""
    if k >= logits.shape[-1]:
        return logits.sort(dim=-1, descending=True, stable=True)
    if logits.device.type == "cpu":
        # CPU topk is a slow partial sort; a numpy quickselect then a small sort is several times faster
        ids = torch.from_numpy(np.argpartition(logits.numpy(), -k, axis=-1)[:, -k:])
        values, order = logits.gather(1, ids).sort(dim=-1, descending=True, stable=True)
        return values, ids.gather(1, order)
    return logits.topk(k, dim=-1)


def sample(logits: Tensor, p: RowParams, u: Tensor) -> Tensor:
    """logits: [B, V] float32, u: [B] uniforms -> tokens: [B] int64."""
    if p.all_greedy:
        return logits.max(dim=-1).indices
    if logits.device.type == "cpu" and p.uniform_k and not p.any_top_p and p.kmax < logits.shape[-1]:
        return sample_host(logits, p, u)
    # 1. top-k candidates, scaled by temperature: [B, K]
    values, ids = top_candidates(logits, p.kmax)
    values = values / p.temperature
    if not p.uniform_k:
        rank = torch.arange(p.kmax, device=logits.device)
        values = values.masked_fill(rank[None, :] >= p.top_k[:, None], float("-inf"))
    probs = values.softmax(dim=-1)
    cdf = probs.cumsum(dim=-1)
    if p.any_top_p:
        # 2. top-p: keep a candidate while the mass before it is below p (the first one always stays)
        probs = probs.masked_fill(cdf - probs >= p.top_p, 0.0)
        cdf = probs.cumsum(dim=-1)
    # 3. inverse CDF with the row's uniform
    pick = (cdf < u[:, None] * cdf[:, -1:]).sum(dim=-1, keepdim=True).clamp(max=p.kmax - 1)
    chosen = ids.gather(1, pick)[:, 0]
    return torch.where(p.greedy, logits.max(dim=-1).indices, chosen) if p.any_greedy else chosen


def sample_host(logits: Tensor, p: RowParams, u: Tensor) -> Tensor:
    """`sample` for CPU tensors when every row keeps the same k candidates and none uses top-p (the checkpoints'
    defaults), in numpy: a dozen small torch ops cost more in dispatch than the math, and this runs 16 times per
    Talker step. The candidates stay in quickselect order, which depends only on the row's logits."""
    x = logits.numpy()  # [B, V]
    rows = np.arange(x.shape[0])
    ids = np.argpartition(x, -p.kmax, axis=-1)[:, -p.kmax :]  # [B, K]
    values = x[rows[:, None], ids] / p.temperature.numpy()
    cdf = np.cumsum(np.exp(values - values.max(axis=-1, keepdims=True)), axis=-1)
    pick = np.minimum((cdf < u.numpy()[:, None] * cdf[:, -1:]).sum(axis=-1), p.kmax - 1)
    tokens = ids[rows, pick]
    if p.any_greedy:
        tokens = np.where(p.greedy.numpy(), x.argmax(axis=-1), tokens)
    return torch.from_numpy(tokens)


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: Tensor) -> Tensor:
    """As in HF: seen tokens' logits are divided by the penalty when positive, multiplied when negative.

    logits: [B, V], seen: [B, V] bool, penalty: [B, 1]
    """
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)

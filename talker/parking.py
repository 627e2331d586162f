"""A starved request's slot state in host memory while its slot serves queued work (worker thread only).

What a slot holds for its request: its KV cache up to its length, and its row of each per-slot buffer of the runner
(next input, text row, KV length, frame count, seen codes), with the codec part kept of its next input (its text
token was missing: talker/runner.py). Copied out whole and back whole, into whatever slot it gets, the request
resumes with the same inputs, so the same audio. Nothing else is per slot: the code predictor's cache is rewritten
at every step, and a request's random draws follow from its seed and frame count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(slots=True, eq=False)
class ParkedSlot:
    k: Tensor  # [L, Hkv, length, D]
    v: Tensor
    rows: dict[str, Tensor]  # the runner's per-slot buffers, by name: each one's row
    kept: Tensor | None  # [H] on the device: the codec part of its next input

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + sum(row.nbytes for row in self.rows.values())


def to_host(t: Tensor) -> Tensor:
    """A host copy of `t`. From CUDA into pinned memory, without waiting: the copy back is queued behind it on the
    same stream, and the host side is never read."""
    if t.device.type == "cpu":
        return t.clone(memory_format=torch.contiguous_format)
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host

"""The Talker's KV cache: slots for continuous batching (the code predictor keeps its own, see fused_predictor)."""

from __future__ import annotations

import torch
from torch import Tensor

from talker.models.qwen3_tts.layers import sdpa


class SlotKVCache:
    """A fixed number of slots, each with its own length. Requests join and leave at any step boundary.

    k, v: [L, S, Hkv, Tmax, D]. Lengths live on the host (the scheduler knows them without a device sync).
    """

    def __init__(
        self, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        shape = (layers, slots, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self._mode = "decode"
        self._slots: Tensor | None = None
        self._positions: Tensor | None = None
        self._mask: Tensor | None = None
        self._span: slice | None = None
        self._kv_len = 0

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def bytes_per_slot(self) -> int:
        return self.nbytes // self.k.shape[1]

    def slot_rows(self, slot: int, length: int) -> tuple[Tensor, Tensor]:
        """Views of the keys and values `slot` holds at positions [0, length): [L, Hkv, length, D] each."""
        return self.k[:, slot, :, :length], self.v[:, slot, :, :length]

    def load_slot(self, slot: int, k: Tensor, v: Tensor) -> None:
        """Writes `slot_rows`' copies back, into any slot; positions past them are never read before written."""
        n = k.shape[2]
        self.k[:, slot, :, :n].copy_(k, non_blocking=True)
        self.v[:, slot, :, :n].copy_(v, non_blocking=True)

    def for_prefill(self, slots: Tensor) -> SlotKVCache:
        """Next forward writes positions [0, T) of each row's slot (rows right-padded to T) and attends causally
        within them. Padding writes past a row's length are overwritten by its decode steps before they are read."""
        self._mode, self._slots = "prefill", slots
        return self

    def for_decode(self, slots: Tensor, positions: Tensor, kv_len: int,
                   span: tuple[int, int] | None = None) -> SlotKVCache:
        """Next forward writes one token per row at `positions` and attends to [0, position] of each row.

        slots, positions: [B]; kv_len: host-known max(position) + 1; span: (first, B) when the slots are
        first, first + 1, ... (host-known): the rows' keys and values are then read as a view, not gathered.
        """
        self._mode, self._slots, self._positions, self._kv_len = "decode", slots, positions, kv_len
        self._span = None if span is None else slice(span[0], span[0] + span[1])
        # mask: [B, 1, 1, kv_len]
        self._mask = (torch.arange(kv_len, device=positions.device) <= positions[:, None])[:, None, None, :]
        return self

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        assert self._slots is not None
        if self._mode == "prefill":
            t = k.shape[2]
            self.k[layer, self._slots, :, :t] = k
            self.v[layer, self._slots, :, :t] = v
            return sdpa(q, k, v, causal=True)
        assert self._positions is not None
        # k, v: [B, Hkv, 1, D] written at (slot, position) of each row
        kl, vl = self.k[layer], self.v[layer]
        kl[self._slots, :, self._positions] = k[:, :, 0]
        vl[self._slots, :, self._positions] = v[:, :, 0]
        rows = self._slots if self._span is None else self._span  # a gather, or a view of consecutive slots
        keys = kl[rows, :, : self._kv_len]
        values = vl[rows, :, : self._kv_len]
        return sdpa(q, keys, values, mask=self._mask)

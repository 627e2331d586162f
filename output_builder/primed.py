"""Codec states that have heard a cloned voice's reference. In-context cloning decodes the reference's frames
before the voice's own, as the official package does, and drops their audio; at real sizes on a CPU that is tens
of milliseconds a frame, so seconds for a reference. A voice's first request pays it once per codec; later ones
start from a copy of the state (a few MiB at real sizes)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch

from output_builder.codecs.qwen12hz import Qwen12HzCodec
from output_builder.codecs.qwen12hz_stream import DecodeStream

PRIMED_MAX = 16  # voices whose primed state is kept (least recently used goes first)


class PrimedStates:
    def __init__(self, size: int = PRIMED_MAX) -> None:
        self.size = size
        self._states: OrderedDict[bytes, DecodeStream] = OrderedDict()

    def open(self, codec: Qwen12HzCodec, context: np.ndarray) -> DecodeStream:
        """A new stream that has decoded `context` ([G, F] codes) and heard nothing since."""
        context = np.ascontiguousarray(context, dtype=np.int64)
        key = hashlib.blake2b(context.tobytes() + bytes(str(context.shape), "ascii"), digest_size=16).digest()
        primed = self._states.get(key)
        if primed is None:
            primed = codec.open_stream()
            codec.decode_streams([(primed, torch.from_numpy(context))])
            if self.size:
                self._states[key] = primed
                while len(self._states) > self.size:
                    self._states.popitem(last=False)
        else:
            self._states.move_to_end(key)
        return primed.copy()

    def __len__(self) -> int:
        return len(self._states)

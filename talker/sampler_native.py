"""The CPU sampling kernel (talker/sampler_kernel.c): `sample` for CPU float32 logits in one call per draw.

On CPU a Talker step samples 16 times (codebook 0, then each residual codebook), and selecting the top 50 of
2,048 logits per row is the largest single cost there: numpy's introselect takes ~17 µs per row, the kernel ~4.5,
and the call releases the GIL while it runs. Compiled when the package is installed (setup.py). Optional: without
it the torch and numpy paths of talker/sampler.py draw from the same distribution.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch
from torch import Tensor

from common.native import installed_library
from talker.sampler import RowParams

log = logging.getLogger("talkstream.sampler")
MODULE = "talker._sampler_kernel"


class SamplingKernel:
    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))
        fn = self._lib.sample_rows
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        fn.argtypes = [p, i64, i64, i64, p, p, p, p, p, p, i64, p, p]
        fn.restype = ctypes.c_int
        self._fn = fn
        self.path = library

    @staticmethod
    def accepts(logits: Tensor) -> bool:
        return logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.stride(-1) == 1

    def sample(
        self, logits: Tensor, p: RowParams, u: Tensor, seen: Tensor | None = None, penalty: Tensor | None = None,
    ) -> Tensor:
        """logits: [B, V] float32 (rows contiguous), u: [B] float32 (any stride); seen: [B, V] bool with
        penalty: [B, 1] for the repetition penalty -> tokens: [B] int64."""
        b, vocab = logits.shape
        if not self.accepts(logits) or u.dtype != torch.float32 or u.shape != (b,):
            raise ValueError("the sampling kernel needs float32 CPU logits [B, V] with contiguous rows and u [B]")
        if (seen is None) != (penalty is None):
            raise ValueError("seen and penalty go together")
        if seen is not None and penalty is not None:
            seen, penalty = seen.contiguous(), penalty.float().contiguous()
            if seen.shape != logits.shape or seen.dtype != torch.bool or penalty.numel() != b:
                raise ValueError("seen must be [B, V] bool and penalty [B, 1]")
        out = torch.empty(b, dtype=torch.long)
        status = self._fn(
            logits.data_ptr(), b, vocab, logits.stride(0),
            seen.data_ptr() if seen is not None else None, penalty.data_ptr() if penalty is not None else None,
            p.temperature.data_ptr(), p.top_k.data_ptr(), p.top_p.data_ptr(), u.data_ptr(), u.stride(0),
            p.greedy.data_ptr(), out.data_ptr(),
        )
        if status != 0:
            raise MemoryError("the sampling kernel could not allocate its scratch")
        return out


def load_sampling_kernel() -> SamplingKernel | None:
    """The installed kernel, or None (logged) when this install has none."""
    library = installed_library(MODULE)
    if library is None:
        log.warning("native sampling kernel off: this install has none (built by `pip install` on Linux with a C "
                    "compiler); using the torch path")
        return None
    try:
        return SamplingKernel(library)
    except (OSError, AttributeError) as exc:
        log.warning("native sampling kernel off (%s); using the torch path", exc)
        return None

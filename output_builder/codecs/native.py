"""Native CPU kernels for the codec (kernels.c), compiled when the package is installed (setup.py).

Optional by design: without them (an install that could not build them, or ``native_kernels=False``) the codec runs
its torch path, which computes the same function.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch
from torch import Tensor

from common.native import installed_library

log = logging.getLogger("talkstream.codec")

MODULE = "output_builder.codecs._kernels"


class NativeKernels:
    """ctypes front of the compiled library; the call releases the GIL while it runs."""

    LANES = 16  # time steps per vector in kernels.c; shorter outputs run scalar code, slower than torch's GEMM

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))
        self._lib.snake.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 7
        self._lib.snake.restype = None
        self._lib.conv.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 12
        self._lib.conv.restype = None
        self.path = library

    @staticmethod
    def accepts(x: Tensor) -> bool:
        """Float32 on the CPU, time contiguous: what :meth:`snake` reads and writes."""
        return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 3 and x.stride(-1) == 1

    def snake(self, x: Tensor, alpha: Tensor, inv_beta: Tensor, out: Tensor) -> Tensor:
        """out = x + inv_beta * sin(alpha * x)^2. x, out: [B, C, T]; alpha, inv_beta: C contiguous floats."""
        if not (self.accepts(x) and self.accepts(out)) or out.shape != x.shape:
            raise ValueError("snake needs float32 CPU tensors [B, C, T] of one shape with contiguous time")
        if not (alpha.is_contiguous() and inv_beta.is_contiguous() and alpha.numel() == inv_beta.numel() == x.shape[1]):
            raise ValueError("snake needs contiguous alpha and inv_beta with one value per channel")
        b, c, t = x.shape
        self._lib.snake(x.data_ptr(), out.data_ptr(), alpha.data_ptr(), inv_beta.data_ptr(), b, c, t,
                        x.stride(0), x.stride(1), out.stride(0), out.stride(1))
        return out

    def conv(self, x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int, residual: Tensor | None) -> Tensor:
        """Valid conv1d (+ residual). x: [B, C_in, L]; weight: [C_out, C_in, K] -> [B, C_out, L - (K-1) * d]."""
        (b, c_in, length), (c_out, w_in, taps) = x.shape, weight.shape
        t = length - (taps - 1) * dilation
        if w_in != c_in or t < 0 or weight.dtype != torch.float32:
            raise ValueError(f"conv weight {tuple(weight.shape)} does not fit input {tuple(x.shape)}")
        weight = weight.contiguous()
        bias = bias.contiguous() if bias is not None else weight.new_zeros(c_out)
        out = x.new_empty(b, c_out, t)
        res = (0, 0, 0)
        if residual is not None:
            if not self.accepts(residual) or residual.shape != out.shape:
                raise ValueError(f"residual must be a float32 CPU tensor {tuple(out.shape)} with contiguous time")
            res = (residual.data_ptr(), residual.stride(0), residual.stride(1))
        self._lib.conv(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), res[0], out.data_ptr(),
                       b, c_in, c_out, taps, dilation, t, x.stride(0), x.stride(1), res[1], res[2],
                       out.stride(0), out.stride(1))
        return out


def load_native() -> NativeKernels | None:
    """The installed kernels, or None (logged) when this install has none."""
    library = installed_library(MODULE)
    if library is None:
        log.warning("native codec kernels off: this install has none (built by `pip install` on Linux with a C "
                    "compiler); using the torch path")
        return None
    try:
        return NativeKernels(library)
    except (OSError, AttributeError) as exc:
        log.warning("native codec kernels off (%s); using the torch path", exc)
        return None

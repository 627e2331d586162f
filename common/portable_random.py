"""Seeded random draws that are the same bits on every x86-64 CPU, for generated checkpoints (the tiny model).

torch's seeded `normal_`/`randn` take a vectorised path on AVX2 and AVX-512 CPUs and a scalar one elsewhere, and the
two give different numbers; numpy's normals go through libm's `exp`/`log`, which need not round alike everywhere.
The oracle fixtures describe the tiny checkpoint by the hash of its weights, so its draws here use integer
operations and IEEE-exact float ones only: PCG64's raw 64-bit outputs, each cut into four 16-bit uniforms whose sum
(Irwin-Hall) is close to a normal, then one multiply in float64 and one rounding to float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

_LANE = 1 << 16
# The sum of four uniform integers in [0, 2^16) has variance 4 (2^32 - 1) / 12; this makes it 1. sqrt and division
# are correctly rounded in IEEE arithmetic (unlike `x ** -0.5`, which calls libm's pow).
_UNIT = math.sqrt(3.0 / (_LANE * _LANE - 1))
_CHUNK = 1 << 20  # draws per numpy pass: bounded memory for the 0.6b size's large matrices


class PortableRandom:
    """A seeded stream of draws; the same seed and the same sequence of calls give the same bits on every CPU."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.Generator(np.random.PCG64(seed)).bit_generator

    def normal(self, shape: Sequence[int], std: float) -> torch.Tensor:
        """float32, mean 0, standard deviation `std` (pass an exactly computed one, e.g. `1 / math.sqrt(n)`);
        bell-shaped, with tails cut at 2 sqrt(3) std."""
        n = math.prod(shape)
        out = np.empty(n, np.float32)
        scale = std * _UNIT
        for start in range(0, n, _CHUNK):
            raw = self._bits.random_raw(min(_CHUNK, n - start))
            lanes = raw.view(np.uint16).reshape(-1, 4)  # their sum does not depend on the byte order
            total = lanes[:, 0].astype(np.int32)
            for k in (1, 2, 3):
                total += lanes[:, k]
            total -= 2 * (_LANE - 1)  # centred: an exact integer, |x| < 2^18
            out[start : start + len(raw)] = total * scale  # exact int -> float64, one product, one rounding
        return torch.from_numpy(out).reshape(tuple(shape))

    def integers(self, high: int, shape: Sequence[int]) -> torch.Tensor:
        """int64 in [0, high) (the modulo's bias is below 2^-40 for any `high` under 2^24)."""
        raw = self._bits.random_raw(math.prod(shape))
        return torch.from_numpy((raw % np.uint64(high)).astype(np.int64)).reshape(tuple(shape))


def coarse(x: float, bits: int = 6) -> float:
    """`x` rounded to `bits` significant bits. A factor computed from a forward pass differs in its last bits from
    CPU to CPU; weights scaled by its coarse value do not (unless it lies within ~1e-6 of a rounding boundary), and
    the product with a float32 weight is then one correctly rounded multiply."""
    mantissa, exponent = math.frexp(x)
    return math.ldexp(round(mantissa * (1 << bits)) / (1 << bits), exponent)

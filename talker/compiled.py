"""The static step's programs, one per batch bucket: `torch.compile(fullgraph=True, dynamic=False)` of the Talker's
forward with codebooks 0 and 1, and of one further code predictor sub-step with its draw; on CUDA under CUDA graphs
(`mode="reduce-overhead"`). Prefill stays outside them.

`compile` (EngineConfig): `off` is the eager step (the parity reference), `on` compiles every bucket before the
engine is ready, `auto` compiles where it was measured faster (docs/benchmarks.md). What Inductor generates is
cached under the cache directory, so a restart reuses it. A compile that fails leaves the eager step in place with
one warning (engine/engine.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from talker.models.qwen3_tts.config import Qwen3TTSConfig
from talker.models.qwen3_tts.static import StaticTalker

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
COMPILE_MODES = ("auto", "on", "off")
SMALL_MODEL_PARAMS = 16_000_000  # below this a step is a few ms: compiling costs more at start than it saves
log = logging.getLogger("talkstream.compile")


def buckets_for(max_batch: int) -> tuple[int, ...]:
    """The batch sizes the programs are built for: BUCKETS below max_batch, then max_batch itself."""
    return (*(b for b in BUCKETS if b < max_batch), max_batch)


def bucket_for(rows: int, buckets: tuple[int, ...]) -> int:
    return next(b for b in buckets if b >= rows)


def wants_compile(mode: str, device: torch.device, arch: Qwen3TTSConfig) -> bool:
    """`auto`: on for a real checkpoint on the CPU (measured faster there); off for `tiny` (its step is a few
    milliseconds, its start would wait minutes for the compiler) and on CUDA until measured there."""
    if mode == "on":
        return True
    step_params = arch.talker.linear_params + (arch.num_code_groups - 1) * arch.predictor.linear_params
    return mode == "auto" and device.type == "cpu" and step_params >= SMALL_MODEL_PARAMS


def use_cache_dir(cache_dir: Path) -> None:
    """Inductor's generated code goes under the engine's cache directory (unless the user chose another)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_dir(cache_dir)))


def inductor_dir(cache_dir: Path) -> Path:
    """A directory per CPU instruction set torch runs: torch 2.13's cache does not tell code made for one from code
    made for another (made for AVX-512 and read under ATEN_CPU_CAPABILITY=avx2, a graph gave garbage; the other way
    round, it crashed the process)."""
    return cache_dir / "inductor" / torch.backends.cpu.get_cpu_capability().lower()


class Programs:
    """`decode` and `sample` of a StaticTalker per bucket, compiled or (`compiled=False`) run as written."""

    def __init__(self, static: StaticTalker, buckets: tuple[int, ...], compiled: bool) -> None:
        self.static, self.buckets, self.compiled = static, buckets, compiled
        self._decode: Callable[..., Any] = _decode_program(static)
        self._first: Callable[..., Any] = _first_program(static)
        self._next: Callable[..., Any] = static.sample_next
        self._started = time.perf_counter()
        if compiled:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(BUCKETS))
            torch._dynamo.config.accumulated_recompile_limit = max(
                torch._dynamo.config.accumulated_recompile_limit, 16 * len(BUCKETS))
            cuda = static.codec_embedding.device.type == "cuda"
            # CUDA graphs on CUDA (what mode="reduce-overhead" sets)
            options: dict[str, str | int | bool | Callable[..., Any]] = {"triton.cudagraphs": True} if cuda else {}
            self._decode = torch.compile(self._decode, fullgraph=True, dynamic=False, options=options)
            self._first = torch.compile(self._first, fullgraph=True, dynamic=False, options=options)
            self._next = torch.compile(self._next, fullgraph=True, dynamic=False, options=options)

    def decode(self, bucket: int, *args: Any) -> torch.Tensor:
        """The Talker's forward: see StaticTalker.decode."""
        out: torch.Tensor = self._decode(bucket, *args)
        return out

    def first(self, bucket: int, *args: Any) -> tuple[torch.Tensor, ...]:
        """Codebooks 0 and 1: see StaticTalker.sample_first."""
        out: tuple[torch.Tensor, ...] = self._first(bucket, *args)
        return out

    def next(self, *args: Any) -> tuple[torch.Tensor, ...]:
        """Codebook g > 1: see StaticTalker.sample_next (its bucket is its inputs' size)."""
        out: tuple[torch.Tensor, ...] = self._next(*args)
        return out

    def done(self, bucket: int) -> None:
        """Progress of a warm-up, in the log."""
        if self.compiled:
            log.info("compiled the step for batch bucket %d (%d of %d) at %.1f s", bucket,
                     self.buckets.index(bucket) + 1, len(self.buckets), time.perf_counter() - self._started)


def _decode_program(static: StaticTalker) -> Callable[..., torch.Tensor]:
    def decode(b: int, next_embed: torch.Tensor, lengths: torch.Tensor, active: torch.Tensor,
               k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # the persistent buffers whole, sliced here: their addresses stay the same from step to step (CUDA graphs)
        return static.decode(next_embed[:b], lengths[:b], active, k, v)

    return decode


def _first_program(static: StaticTalker) -> Callable[..., tuple[torch.Tensor, ...]]:
    def first(b: int, candidates: tuple[int, int], hidden: torch.Tensor, frames: torch.Tensor, seen: torch.Tensor,
              *rest: Any) -> tuple[torch.Tensor, ...]:
        penalty, seeds, talker, predictor, k, v = rest
        return static.sample_first(hidden, frames[:b], seen[:b], penalty, seeds, talker, predictor, k, v, candidates)

    return first

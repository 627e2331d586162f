"""A step's published result: the codes on the host (or on their way there), which requests they belong to,
and the step's timestamps."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from talker.device import COMPLETED, Fence, HostBuffer


@dataclass(slots=True)
class StepTiming:
    """Monotonic seconds. The step gap is `forward_start` of step N+1 minus `sample_end` of step N."""

    step: int
    start: float
    forward_start: float = 0.0
    forward_end: float = 0.0
    sample_end: float = 0.0
    published: float = 0.0
    batch: int = 0
    contiguous: bool = True  # False when the worker sat idle before this step
    gpu_forward_start: Any = None  # CUDA events (None on CPU)
    gpu_sample_end: Any = None


Row = tuple[str, Any, int]  # request id, the output side's key for it (`Seq.sink`), segment
_RELEASE = threading.Lock()  # a snapshot's two readers release it from two threads


@dataclass(slots=True, eq=False)
class StepSnapshot:
    step: int
    rows: tuple[Row, ...]  # per row, in batch order: ids, not objects, cross the bridge
    codes: Tensor | None  # host: [B, G] int32 once the fence is done
    fence: Fence = COMPLETED
    error: BaseException | None = None  # the step failed: its requests fail
    fatal: bool = False  # the engine is dead
    buffer: HostBuffer | None = None
    timing: StepTiming | None = None
    first_frames: bool = False  # the step prefilled new requests: its rows hold their first frames
    held: frozenset[Any] = frozenset()  # keys of the rows whose text ran out at this step: they wait for more
    _readers: int = 2  # the output side and the worker's retire check

    def release(self) -> None:
        """Called once by each reader (the output side, the worker's retire check; two threads in async mode) when
        it no longer needs `codes`: the last one hands the host buffer back."""
        with _RELEASE:
            self._readers -= 1
            last = self._readers == 0
        if last and self.buffer is not None:
            self.buffer.in_use = False


@dataclass(slots=True)
class TimingRing:
    """The last `size` steps' timings, for benchmarks and /metrics."""

    size: int = 4096
    items: deque[StepTiming] = field(default_factory=deque)
    total_steps: int = 0

    def push(self, t: StepTiming) -> None:
        if len(self.items) >= self.size:
            self.items.popleft()
        self.items.append(t)
        self.total_steps += 1

    def snapshot(self) -> list[StepTiming]:
        return list(self.items)

    def clear(self) -> None:
        self.items.clear()


def gpu_gaps_us(timings: list[StepTiming]) -> list[float]:
    """GPU-side gaps (CUDA events) between consecutive steps; synchronizes, so call it after a run."""
    gaps = []
    for prev, cur in itertools.pairwise(timings):
        if cur.contiguous and cur.step == prev.step + 1 and prev.gpu_sample_end is not None \
                and cur.gpu_forward_start is not None:
            cur.gpu_forward_start.synchronize()
            gaps.append(prev.gpu_sample_end.elapsed_time(cur.gpu_forward_start) * 1e3)
    return gaps


def step_gaps_us(timings: list[StepTiming]) -> list[float]:
    """Gaps between consecutive steps in microseconds (only where step N+1 directly follows step N)."""
    gaps = []
    for prev, cur in itertools.pairwise(timings):
        if cur.contiguous and cur.step == prev.step + 1 and prev.sample_end and cur.forward_start:
            gaps.append((cur.forward_start - prev.sample_end) * 1e6)
    return gaps

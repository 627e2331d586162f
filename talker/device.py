"""What differs between CPU and CUDA, behind one small interface.

CUDA: a copy stream, reused pinned host buffers and an event per snapshot. CPU: a plain host copy and a fence that
is already complete. The worker thread calls `enter_thread()` once to bind its device, thread count and CPU priority.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from common.children import lower_priority

log = logging.getLogger("talkstream.device")


class Fence(Protocol):
    def done(self) -> bool: ...

    def wait(self) -> None: ...


class CompletedFence:
    __slots__ = ()

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


COMPLETED = CompletedFence()


class CudaFence:
    __slots__ = ("event",)

    def __init__(self, event: torch.cuda.Event) -> None:
        self.event = event

    def done(self) -> bool:
        return bool(self.event.query())

    def wait(self) -> None:
        self.event.synchronize()


def resolve_device(name: str) -> torch.device:
    """auto | cpu | cuda | cuda:N -> a device; CUDA devices always carry their index (set_device needs one)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


SMALL_STEP_PARAMS = 16_000_000  # weights a step reads below which it is op dispatch, not arithmetic (tiny: ~0.1M)


@dataclass(frozen=True, slots=True)
class Threads:
    talker: int  # torch threads of the Talker worker
    codec: int  # of the codec process


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_plan(requested: int, step_params: int, cores: int, int8: bool = False) -> Threads:
    """torch threads per worker. `requested` > 0 sets both; 0 chooses from the model's size (measured,
    docs/benchmarks.md, 2 cores):
    - a small model's step is op dispatch: one thread each, and the asyncio loop keeps a core of its own;
    - at real sizes a step streams hundreds of MB of weights and the codec costs ~0.6 of a core per real-time
      stream: the codec process gets a quarter of the cores (at least one), the Talker the rest;
    - but a float32 Talker takes every core of a machine of two (0.6B sizes, one request, an AVX2 VM: 0.119 audio s
      per s with 2 threads against 0.086 with 1; a second codec thread gave 0.45 against 0.47 at 4 requests), while
      an int8 one, which reads a quarter of the bytes, leaves the codec its core (0.6B sizes, 2 AVX-512 cores: 0.77
      against 0.48 audio s per s at one request, 1.50 against 1.32 at four; the AVX2 VM: 0.331 against 0.290)."""
    if requested > 0:
        return Threads(requested, requested)
    if step_params < SMALL_STEP_PARAMS:
        return Threads(1, 1)
    codec = max(1, cores // 4)
    return Threads(max(1, cores if cores <= 2 and not int8 else cores - codec), codec)


@dataclass(slots=True)
class HostBuffer:
    """A reusable host buffer for one step's codes; `in_use` until the consumer has read it."""

    data: Tensor
    in_use: bool = False


class DeviceLayer:
    def __init__(self, device: torch.device, threads: int = 1, ring: int = 4, nice: int = 0) -> None:
        self.device = device
        self.threads = threads
        self.nice = nice
        self.is_cuda = device.type == "cuda"
        self._ring: list[HostBuffer] = []
        self._ring_size = ring
        self._next = 0
        self._copy_stream: torch.cuda.Stream | None = None

    def enter_thread(self) -> None:
        torch.set_num_threads(self.threads)
        lower_priority(self.nice)
        if self.is_cuda:
            torch.cuda.set_device(self.device)
            self._copy_stream = torch.cuda.Stream(self.device)

    def _host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> HostBuffer:
        for _ in range(len(self._ring)):
            buf = self._ring[self._next]
            self._next = (self._next + 1) % len(self._ring)
            if not buf.in_use and buf.data.numel() >= _numel(shape) and buf.data.dtype == dtype:
                buf.in_use = True
                return buf
        size = max(_numel(shape), 64 * 16)
        buf = HostBuffer(torch.empty(size, dtype=dtype, pin_memory=self.is_cuda), in_use=True)
        if len(self._ring) < self._ring_size:
            self._ring.append(buf)
        return buf

    def to_host(self, codes: Tensor) -> tuple[Tensor, Fence, HostBuffer | None]:
        """Enqueue the device-to-host copy of one step's codes. Returns (host view, fence, buffer to release)."""
        if not self.is_cuda:
            return codes, COMPLETED, None  # a fresh tensor every step: nothing to copy
        assert self._copy_stream is not None
        buf = self._host_buffer(tuple(codes.shape), codes.dtype)
        host = buf.data[: codes.numel()].view(codes.shape)
        src = codes.clone()
        self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._copy_stream):
            host.copy_(src, non_blocking=True)
            src.record_stream(self._copy_stream)
            event = torch.cuda.Event()
            event.record(self._copy_stream)
        return host, CudaFence(event), buf

    def gpu_mark(self) -> torch.cuda.Event | None:
        """A timing event on the compute stream (CUDA only): the GPU-side step gap is measured between these."""
        if not self.is_cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n

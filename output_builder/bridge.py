"""The one bridge from the Talker worker to asyncio, and the output work behind it.

async mode: the worker's `publish` is one `call_soon_threadsafe` per step; a router task on the event loop takes
snapshots in order, waits for each copy off-loop and routes rows to requests; two lane tasks run the codec calls on
the codec worker threads: new requests' first chunks on the urgent lane, which the codec serves in the middle of a
backlog call (output_builder/codec_process.py), the rest on the backlog lane.
sync mode: the same routing and decoding run inline on the worker before its next step (the "before" picture).
Both cut chunks and compose codec calls identically (`OutputPipeline.batches`), so they produce byte-identical
audio: the codec's output for a row is exact for a given batch composition, not across compositions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from output_builder.assembler import ChunkJob, RequestOutput
from output_builder.codec_process import CodecProcessError, DecodeRequest, decode_batch
from output_builder.codecs.qwen12hz import Qwen12HzCodec
from output_builder.primed import PrimedStates
from talker.request import FinishReason, RequestFailedError
from talker.snapshot import StepSnapshot

log = logging.getLogger("talkstream.output")
FaultHook = Callable[[str, list[ChunkJob]], None]
STOP_TIMEOUT_S = 5.0


class CodecTimeoutError(CodecProcessError):
    """A codec decode call took longer than `codec_timeout_s`: the codec worker is hung."""


class DecodeBackend(Protocol):
    def decode(self, jobs: list[tuple[int, np.ndarray]], urgent: bool = False,
               context: dict[int, int] | None = None) -> list[np.ndarray]: ...

    def close_stream(self, sid: int) -> None: ...


class InProcessCodec:
    """The codec in this process (sync mode: used inline by the Talker worker)."""

    def __init__(self, codec: Qwen12HzCodec) -> None:
        self.codec = codec
        self._states: dict[int, object] = {}
        self._closed: list[int] = []
        self._primed = PrimedStates()

    def decode(self, jobs: list[tuple[int, np.ndarray]], urgent: bool = False,
               context: dict[int, int] | None = None) -> list[np.ndarray]:
        closed, self._closed = self._closed, []
        return decode_batch(self.codec, self._states, DecodeRequest(jobs, closed, context or {}), None, self._primed)

    def close_stream(self, sid: int) -> None:
        self._closed.append(sid)


class ChunkDecoder:
    """Turns chunk jobs into 16-bit PCM, each request's codec state kept by the backend under its stream id."""

    def __init__(self, backend: DecodeBackend) -> None:
        self.backend = backend
        self.fault_hook: FaultHook | None = None  # test-only fault injection
        self.open_streams: set[int] = set()  # stream ids with codec state (a leak shows here)

    def decode(self, jobs: list[ChunkJob], urgent: bool = False) -> list[np.ndarray | None]:
        if self.fault_hook is not None:
            self.fault_hook("codec", jobs)
        live = [j for j in jobs if j.codes is not None and not j.out.stream.done]
        for j in live:
            self.open_streams.add(j.out.stream_id)
            if j.out.released:  # released on the loop meanwhile
                self.open_streams.discard(j.out.stream_id)
        pairs = [(j.out.stream_id, j.codes) for j in live if j.codes is not None]
        context = {j.out.stream_id: j.context for j in live if j.context}
        pcm = self.backend.decode(pairs, urgent, context) if pairs else []
        by_job = {id(j): a for j, a in zip(live, pcm, strict=True)}
        return [by_job.get(id(j)) for j in jobs]

    def release(self, out: RequestOutput) -> None:
        if not out.released:
            out.released = True
            self.open_streams.discard(out.stream_id)
            self.backend.close_stream(out.stream_id)


class OutputPipeline:
    """Routing and delivery shared by both modes. `deliver*` run on the event loop."""

    def __init__(self, decoder: ChunkDecoder, on_fatal: Callable[[BaseException], None],
                 batch_frames: int = 64) -> None:
        self.decoder = decoder
        self.on_fatal = on_fatal
        self.batch_frames = batch_frames
        self.jobs_in_flight = 0
        self.tap: Callable[[StepSnapshot, np.ndarray], None] | None = None  # benchmarks: each step's codes

    def route(self, snap: StepSnapshot) -> list[ChunkJob]:
        """Rows of a resolved snapshot → ready chunks (in batch order)."""
        assert snap.codes is not None
        codes = snap.codes.numpy()  # [B, G]
        if snap.buffer is not None:
            codes = codes.copy()  # a reused host buffer (CUDA): pending frames must not alias it once released
        if self.tap is not None:
            self.tap(snap, codes)
        jobs = []
        for row, seq in enumerate(snap.seqs):
            job = seq.sink.push(codes[row], seq.segment)
            if job is not None:
                jobs.append(job)
        snap.release()
        return jobs

    def batches(self, jobs: list[ChunkJob]) -> list[tuple[bool, list[ChunkJob]]]:
        """A step's chunks → codec calls as (urgent, jobs): the new requests' first chunks in one urgent call, then
        the rest in calls of at most `batch_frames` frames. A function of the step's chunks alone."""
        calls: list[tuple[bool, list[ChunkJob]]] = []
        if firsts := [j for j in jobs if j.first]:
            calls.append((True, firsts))
        current: list[ChunkJob] = []
        frames = 0
        for job in (j for j in jobs if not j.first):
            if current and frames + job.frames > self.batch_frames:
                calls.append((False, current))
                current, frames = [], 0
            current.append(job)
            frames += job.frames
        if current:
            calls.append((False, current))
        return calls

    def deliver(self, jobs: list[ChunkJob], pcm: list[np.ndarray | None]) -> None:
        for job, audio in zip(jobs, pcm, strict=True):
            stream = job.out.stream
            if audio is not None:
                stream.usage.frames += job.frames - job.context
                stream.put(audio)
            if job.final is not None:
                self.decoder.release(job.out)
                stream.finish(job.final)

    def fail_jobs(self, jobs: list[ChunkJob], exc: BaseException, on_abort: Callable[[str], None]) -> None:
        log.error("audio output failed for %d request(s): %r", len(jobs), exc)
        for job in jobs:
            self.fail_output(job.out, RequestFailedError(f"audio decoding failed: {exc}", code="output_error"))
            on_abort(job.out.request_id)
        if isinstance(exc, CodecProcessError):
            self.on_fatal(exc)

    def fail_step(self, snap: StepSnapshot) -> None:
        err = snap.error or RuntimeError("step failed")
        for seq in snap.seqs:
            if seq.segment == seq.sink.segment:  # not a finished segment's Seq that was still being stepped
                self.fail_output(seq.sink, RequestFailedError(f"generation failed: {err}", code="generation_error"))
        if snap.fatal:
            self.on_fatal(err)

    def fail_output(self, out: RequestOutput, exc: BaseException) -> None:
        self.abandon(out)
        out.stream.finish(FinishReason.ERROR, exc)

    def abandon(self, out: RequestOutput) -> None:
        out.abandon()
        self.decoder.release(out)


class AsyncBridge:
    """Publisher for async mode plus the two tasks that do the output work beside the decode loop.

    Each step's snapshot crosses once, in order. The worker appends it to a deque and wakes the event loop with
    `call_soon_threadsafe` only when the router is parked. While steps keep coming the router polls the deque
    every `poll_s` instead: on two cores a wake-up per step costs the worker 25-60 µs of GIL hand-off inside the
    step gap (measured), a deque append about 1 µs. A step that holds new requests' first frames wakes it at once.

    The router turns snapshots into codec calls as soon as their copies land. Each lane runs one call at a time
    (`codec_pool` needs a thread per lane): the urgent lane the new requests' first chunks, the backlog lane the
    rest, first in, first out. A backlog call waits for the first chunks of its streams (so a request's chunks
    decode in order), and starts not at all (for up to `hold_s`) while a new request's first chunk is due
    (`first_due`): the Talker step that makes it runs on a core the codec leaves free.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, pipeline: OutputPipeline, codec_pool: ThreadPoolExecutor,
        on_abort: Callable[[str], None], poll_s: float = 0.002, idle_polls: int = 50, codec_timeout_s: float = 30.0,
        first_due: Callable[[], bool] | None = None, hold_s: float = 0.0,
    ) -> None:
        self.loop, self.pipeline, self.pool, self.on_abort = loop, pipeline, codec_pool, on_abort
        self.first_due, self.hold_s = first_due, hold_s
        self.codec_timeout_s = codec_timeout_s
        self.poll_s, self.idle_polls = poll_s, idle_polls
        self._ready: deque[StepSnapshot | None] = deque()
        self._parked = True
        self._wakeup = asyncio.Event()
        self._napping: asyncio.Future[None] | None = None
        self._urgent: deque[list[ChunkJob] | None] = deque()  # None: the router is done
        self._calls: deque[list[ChunkJob] | None] = deque()
        self._urgent_ready, self._calls_ready = asyncio.Event(), asyncio.Event()
        self._firsts: set[int] = set()  # streams whose first chunk is queued or decoding
        self._firsts_done = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def publish(self, snapshot: StepSnapshot | None) -> None:  # worker thread
        self._ready.append(snapshot)
        if self._parked:
            self._parked = False
            self.loop.call_soon_threadsafe(self._wakeup.set)
        elif snapshot is None or snapshot.first_frames:  # first audio: no poll interval's delay
            self.loop.call_soon_threadsafe(self._end_nap)

    def start(self) -> None:
        self._tasks = {self.loop.create_task(self._route(), name="output-router"),
                       self.loop.create_task(self._lane(urgent=True), name="output-first-chunks"),
                       self.loop.create_task(self._lane(urgent=False), name="output-backlog")}

    async def stop(self) -> None:
        self._ready.append(None)
        self._parked = False
        self._wakeup.set()
        self._end_nap()
        if self._tasks:  # tasks stuck behind a hung codec call are cancelled
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    @property
    def backlog(self) -> int:
        return len(self._ready) + len(self._urgent) + len(self._calls)

    async def _next(self) -> StepSnapshot | None:
        polls = 0
        while not self._ready:
            if polls < self.idle_polls:
                polls += 1
                await self._nap()
                continue
            self._parked = True
            if self._ready:  # appended between the check and parking
                self._parked = False
                break
            self._wakeup.clear()
            await self._wakeup.wait()
            polls = 0
        return self._ready.popleft()

    async def _nap(self) -> None:
        """`asyncio.sleep(poll_s)` (as cheap: one future and one timer) that `_end_nap` can cut short."""
        self._napping = nap = self.loop.create_future()
        timer = self.loop.call_later(self.poll_s, self._end_nap)
        try:
            await nap
        finally:
            timer.cancel()
            self._napping = None

    def _end_nap(self) -> None:
        if self._napping is not None and not self._napping.done():
            self._napping.set_result(None)

    async def _route(self) -> None:
        try:
            while (snap := await self._next()) is not None:
                try:
                    await self._route_one(snap)
                except Exception:  # a bug here must not kill the output path for everyone
                    log.exception("output router failed on step %d", snap.step)
        finally:
            self._urgent.append(None)
            self._calls.append(None)
            self._urgent_ready.set()
            self._calls_ready.set()

    async def _route_one(self, snap: StepSnapshot) -> None:
        if snap.error is not None:
            self.pipeline.fail_step(snap)
            return
        if not snap.fence.done():
            await asyncio.to_thread(snap.fence.wait)
        jobs = self.pipeline.route(snap)
        if not jobs:
            return
        self.pipeline.jobs_in_flight += len(jobs)
        for urgent, call in self.pipeline.batches(jobs):
            if urgent:
                self._firsts.update(j.out.stream_id for j in call)
                self._urgent.append(call)
                self._urgent_ready.set()
            else:
                self._calls.append(call)
                self._calls_ready.set()

    async def _lane(self, urgent: bool) -> None:
        """One codec lane: its calls one at a time, in order. The backlog lane also waits out the first chunks
        of its streams (so a stream's chunks decode in order) and, for up to `hold_s`, a first chunk that is due."""
        calls, ready = (self._urgent, self._urgent_ready) if urgent else (self._calls, self._calls_ready)
        while True:
            while not calls:
                ready.clear()
                await ready.wait()
            call = calls.popleft()
            if call is None:
                return
            if not urgent:
                await self._after_firsts(call)
                await self._hold()
            try:
                pcm = await self._decode(call, urgent)
            except Exception as exc:
                self.pipeline.fail_jobs(call, exc, self.on_abort)
            else:
                self.pipeline.deliver(call, pcm)
            finally:
                self.pipeline.jobs_in_flight -= len(call)
                if urgent:
                    self._firsts.difference_update(j.out.stream_id for j in call)
                    self._firsts_done.set()

    async def _after_firsts(self, call: list[ChunkJob]) -> None:
        while any(j.out.stream_id in self._firsts for j in call):
            self._firsts_done.clear()
            await self._firsts_done.wait()

    async def _hold(self) -> None:
        """Keep the codec's core free while a first chunk is due (a new request is in the Talker): its prefill
        step and then its urgent call run without a backlog call beside them."""
        if self.first_due is None or self.hold_s <= 0:
            return
        end = self.loop.time() + self.hold_s
        while self.first_due() and (left := end - self.loop.time()) > 0:
            self._calls_ready.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.002)):
                    await self._calls_ready.wait()

    async def _decode(self, jobs: list[ChunkJob], urgent: bool) -> list[np.ndarray | None]:
        call = self.loop.run_in_executor(self.pool, self.pipeline.decoder.decode, jobs, urgent)
        try:
            return await asyncio.wait_for(call, self.codec_timeout_s)
        except TimeoutError:
            raise CodecTimeoutError(f"the codec decode took longer than {self.codec_timeout_s:g} s") from None


class SyncBridge:
    """Publisher for sync mode: all output work inline on the worker thread; only delivery hops to the loop.

    A decode that hangs here hangs the worker. The engine's watchdog calls `check_decode` on the loop: past
    `codec_timeout_s` the decode's requests fail as in async mode, and the engine is marked dead.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, pipeline: OutputPipeline, on_abort: Callable[[str], None],
        codec_timeout_s: float = 30.0,
    ) -> None:
        self.loop, self.pipeline, self.on_abort = loop, pipeline, on_abort
        self.codec_timeout_s = codec_timeout_s
        self._decoding: tuple[float, list[ChunkJob]] | None = None  # set by the worker, read by the watchdog

    backlog = 0

    def publish(self, snap: StepSnapshot) -> None:  # worker thread
        if snap.error is not None:
            self.loop.call_soon_threadsafe(self.pipeline.fail_step, snap)
            return
        snap.fence.wait()
        jobs = self.pipeline.route(snap)
        if not jobs:
            return
        for _, call in self.pipeline.batches(jobs):
            self._decode(call)

    def _decode(self, jobs: list[ChunkJob]) -> None:
        self._decoding = (time.monotonic(), jobs)
        try:
            pcm = self.pipeline.decoder.decode(jobs)
        except Exception as exc:
            self.loop.call_soon_threadsafe(self.pipeline.fail_jobs, jobs, exc, self.on_abort)
        else:
            self.loop.call_soon_threadsafe(self.pipeline.deliver, jobs, pcm)
        finally:
            self._decoding = None

    def check_decode(self, now: float) -> None:  # event loop
        decoding = self._decoding
        if decoding is not None and now - decoding[0] > self.codec_timeout_s:
            self._decoding = None
            exc = CodecTimeoutError(f"the codec decode took longer than {self.codec_timeout_s:g} s")
            self.pipeline.fail_jobs(decoding[1], exc, self.on_abort)  # fatal: marks the engine dead

    def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

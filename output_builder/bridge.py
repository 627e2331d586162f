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

import numpy as np

from output_builder.assembler import ChunkJob
from output_builder.codec_process import CodecProcessError
from output_builder.pipeline import OutputPipeline
from talker.snapshot import StepSnapshot

log = logging.getLogger("talkstream.output")
STOP_TIMEOUT_S = 5.0
# look-aheads are issued at most this often, those due by then in one codec call: a call's fixed cost is a good part
# of a small chunk's (tiny: 2.5 ms for 1 frame, 4.7 ms for 8), and the lead (0.25 s) leaves room for the wait
LOOK_AHEAD_TICK_S = 0.05


class CodecTimeoutError(CodecProcessError):
    """A codec decode call took longer than `codec_timeout_s`: the codec worker is hung."""


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
        first_due: Callable[[], bool] | None = None, hold_s: float = 0.0, look_ahead_lead_s: float = 0.0,
    ) -> None:
        self.loop, self.pipeline, self.pool, self.on_abort = loop, pipeline, codec_pool, on_abort
        self.first_due, self.hold_s = first_due, hold_s
        self.lead_s = look_ahead_lead_s
        self._look_timer: asyncio.TimerHandle | None = None
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
        if self._look_timer is not None:
            self._look_timer.cancel()
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
        self.pipeline.jobs_in_flight += len(jobs)
        for urgent, call in self.pipeline.batches(jobs):
            if urgent:
                self._firsts.update(j.out.stream_id for j in call)
                self._urgent.append(call)
                self._urgent_ready.set()
            else:
                self._backlog(call)
        if self.pipeline.waiting and self._look_timer is None:  # a tick away: the look-aheads due by then share a call
            self._look_timer = self.loop.call_later(LOOK_AHEAD_TICK_S, self._look_ahead)

    def _backlog(self, call: list[ChunkJob]) -> None:
        self._calls.append(call)
        self._calls_ready.set()

    def _look_ahead(self) -> None:
        """The due look-aheads of requests waiting for text, in a backlog call of their own (so the other streams'
        calls are what they would be without them); a timer for the next one due."""
        self._look_timer = None
        jobs, later = self.pipeline.look_aheads(time.monotonic(), self.lead_s)
        if jobs:
            self.pipeline.jobs_in_flight += len(jobs)
            self._backlog(jobs)
        if later is not None:
            self._look_timer = self.loop.call_later(max(later, LOOK_AHEAD_TICK_S), self._look_ahead)

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
        step and then its urgent call run without a backlog call beside them. A first chunk that is cut but not yet
        handed to the codec is still due: the router may end `first_due` in the same loop iteration as this lane
        wakes, before the urgent lane has run."""
        if self.first_due is None or self.hold_s <= 0:
            return
        end = self.loop.time() + self.hold_s
        while (self.first_due() or self._urgent) and (left := end - self.loop.time()) > 0:
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

"""The Talker worker thread: owns the model, KV cache, sampler state and scheduler.

Its loop is: drain the inbox (block on it when idle) → retire what finished → reslot (only when due) → step. A step
reads like a sentence: schedule, run, snapshot, publish. Reslotting parks requests starved of text when queued work
wants their slots, and brings parked ones back when their text has come (talker/parking.py).

With `prefill_midstep`, new requests do not wait for the step in flight: in the pauses the runner makes between the
code predictor's sub-steps (`Runner.sample_stages`, a generator: the runner never calls back into the worker)
the worker takes the inbox's submits (other commands wait for the step boundary) and runs their prefill there, as
a step of its own that counts as the same step, then goes back to the outer one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from talker.device import DeviceLayer
from talker.runner import Runner, drive
from talker.scheduler import Scheduler, Seq, SeqStatus, StepPlan
from talker.snapshot import Row, StepSnapshot, StepTiming, TimingRing

log = logging.getLogger("talkstream.worker")
MAX_CONSECUTIVE_FAILURES = 3


class Publisher(Protocol):
    def publish(self, snapshot: StepSnapshot) -> None: ...


@dataclass(frozen=True, slots=True)
class Submit:
    seqs: tuple[Seq, ...]  # admitted together when slots allow


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str
    segment: int | None = None  # that segment's Seq alone (a later one may be queued already); None: the request's


@dataclass(frozen=True, slots=True)
class Pause:
    request_id: str
    paused: bool


@dataclass(frozen=True, slots=True)
class Feed:
    """More of a request's text (its tokens after those already sent), or its end."""

    request_id: str
    tokens: tuple[int, ...]
    done: bool = False


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Submit | Abort | Pause | Feed | Stop
FaultHook = Callable[[str, tuple[Seq, ...]], None]


class TalkerWorker:
    def __init__(
        self, runner: Runner, device: DeviceLayer, max_batch: int, publisher: Publisher, eos_id: int,
        max_prefills: int = 32, timing_ring: int = 4096, max_prefill_tokens: int = 2048,
        prefill_midstep: bool = False,
    ) -> None:
        self.runner, self.device, self.publisher, self.eos_id = runner, device, publisher, eos_id
        self.scheduler = Scheduler(max_batch, max_prefills, runner.kv.max_len, max_prefill_tokens)
        self.inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.timings = TimingRing(timing_ring)
        self.fault_hook: FaultHook | None = None  # test-only fault injection
        self.dead: BaseException | None = None
        self._unretired: deque[tuple[StepSnapshot, tuple[Seq, ...]]] = deque()  # and the step's rows
        self._deferred: deque[Command] = deque()  # commands taken mid-step, handled at the next boundary
        self._midstep_open = False  # the step in flight takes mid-step prefills: it makes no first frames itself
        self._midstep = prefill_midstep
        self._step = 0
        self._failures = 0
        self._running = True
        self._thread = threading.Thread(target=self._main, name="talker-worker", daemon=True)

    # Called from other threads -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def send(self, cmd: Command) -> None:
        self.inbox.put(cmd)

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    # Worker thread -------------------------------------------------------------------------------
    def _main(self) -> None:
        self.device.enter_thread()
        try:
            self._loop()
        except BaseException as exc:  # the loop itself broke: the engine cannot continue
            log.exception("talker worker died")
            self._die(exc)

    def _loop(self) -> None:
        pending: StepSnapshot | None = None  # published just before the next forward, or before going idle
        idle = True
        while self._running:
            self._drain(block=pending is None and not self.scheduler.has_work())
            if not self._running:
                break
            if self._unretired:
                self._retire_resolved()
            if self.scheduler.reslot_due():
                self._reslot()
            if self.scheduler.has_work():
                pending = self._run_step(pending, contiguous=not idle)
                idle = False
            else:
                if pending is not None:
                    self._publish(pending)
                    pending = None
                idle = True
        if pending is not None:
            self._publish(pending)

    def _publish(self, snap: StepSnapshot) -> None:
        self.publisher.publish(snap)
        if snap.timing is not None:
            snap.timing.published = time.perf_counter()

    def _drain(self, block: bool) -> None:
        if self._deferred:
            while self._deferred:
                self._handle(self._deferred.popleft())
            block = False  # they may have made work: the loop looks again before it blocks
        if block:
            self._handle(self.inbox.get())
        while not self.inbox.empty():
            self._handle(self.inbox.get_nowait())

    def _handle(self, cmd: Command) -> None:
        sched = self.scheduler
        if isinstance(cmd, Submit):
            if self.dead is not None:
                self._publish_failure(list(cmd.seqs), self.dead, fatal=True)
            else:
                for seq in cmd.seqs:
                    sched.add(seq)
        elif isinstance(cmd, Abort):
            if (found := sched.find(cmd.request_id, cmd.segment)) is not None:
                sched.finish(found)
        elif isinstance(cmd, Pause):
            if (found := sched.by_id.get(cmd.request_id)) is not None:
                sched.set_paused(found, cmd.paused, self._step)
        elif isinstance(cmd, Feed):
            if (found := sched.by_id.get(cmd.request_id)) is not None and found.feed is not None:
                self._feed(found, cmd)
        elif isinstance(cmd, Stop):
            self._running = False

    def _feed(self, seq: Seq, cmd: Feed) -> None:
        assert seq.feed is not None
        if seq.feed.done or not (cmd.tokens or cmd.done):
            return  # nothing new: a starved request stays where it is
        seq.feed.tokens.extend(cmd.tokens)
        seq.feed.done |= cmd.done
        if seq.status is SeqStatus.WAITING:
            return  # its prefill writes the whole row
        if seq.status is SeqStatus.PARKED:  # queued again; its row is written when it has a slot
            self.scheduler.fed(seq, self._step)
            return
        self.runner.write_text(seq)
        if seq.starved:  # the input of its next frame was summed without its text token
            self.runner.refresh(seq.slot)
        self.scheduler.fed(seq, self._step)

    def _reslot(self) -> None:
        """Starved requests give their slots to queued work (what the slots held goes to host memory); parked ones
        whose text came take free slots (it comes back, and their next input is summed with the new text)."""
        sched, runner = self.scheduler, self.runner
        for seq in sched.to_park():
            with self._failing(seq):
                seq.parked = runner.park(seq.slot, seq.held_kv_len)
                sched.park(seq)
        for seq in sched.resume(self._step):
            with self._failing(seq):
                runner.unpark(seq.slot, seq.parked)
                seq.parked = None
                runner.write_text(seq)
                runner.refresh(seq.slot)

    @contextmanager
    def _failing(self, seq: Seq) -> Iterator[None]:
        """A failure ends `seq` alone, unless the device cannot go on."""
        try:
            yield
        except Exception as exc:
            log.error("moving request %s's slot state failed: %r", seq.request_id, exc)
            self.scheduler.finish(seq)
            self._publish_failure([seq], exc, fatal=False)
            if _is_device_fatal(exc):
                raise

    def _retire_resolved(self) -> None:
        """Retire requests whose snapshot is resolved and shows EOS. Never waits for a copy."""
        while self._unretired and self._unretired[0][0].fence.done():
            snap, seqs = self._unretired.popleft()
            assert snap.codes is not None
            code0 = snap.codes.numpy()[:, 0].tolist()
            if self.eos_id in code0:
                for row, code in enumerate(code0):
                    if code == self.eos_id:
                        self.scheduler.finish(seqs[row])
            snap.release()

    def _run_step(self, pending: StepSnapshot | None, contiguous: bool) -> StepSnapshot | None:
        """schedule → publish the previous step → forward → sample → snapshot. Returns the unpublished snapshot."""
        timing = StepTiming(step=self._step, start=time.perf_counter(), contiguous=contiguous)
        plan = self.scheduler.schedule()
        self._midstep_open = not plan.prefill
        try:
            self.runner.prepare(plan)
            if pending is not None:
                self._publish(pending)
            codes = self._forward_and_sample(plan, timing)
        except Exception as exc:
            if pending is not None and pending.timing is not None and not pending.timing.published:
                self._publish(pending)
            self._step_failed(plan, exc)
            return None
        self._failures = 0
        self.scheduler.advance(plan, self._step)
        held = self._keep_starved() if self.scheduler.starved else frozenset()
        snap = self._snapshot(plan, codes, timing, held)
        self.timings.push(timing)
        self._step += 1
        return snap

    def _keep_starved(self) -> frozenset[Any]:
        """Their text ran out at this step: the runner keeps the codec part of their next input. Returns their
        output keys, for the step's snapshot."""
        starved = self.scheduler.starved
        self.runner.keep([seq.slot for seq in starved])
        held = frozenset(seq.sink for seq in starved)
        starved.clear()
        return held

    def _snapshot(self, plan: StepPlan, codes: torch.Tensor, timing: StepTiming,
                  held: frozenset[Any] = frozenset()) -> StepSnapshot:
        host, fence, buf = self.device.to_host(codes)
        snap = StepSnapshot(self._step, rows_of(plan.batch), host, fence, buffer=buf, timing=timing,
                            first_frames=bool(plan.prefill), held=held)
        self._unretired.append((snap, plan.batch))
        timing.batch = len(plan.batch)
        return snap

    def _sample(self, plan: StepPlan, hidden: torch.Tensor) -> torch.Tensor:
        """The runner's sample; with mid-step prefill, `_between` runs in each pause between its sub-steps (not in
        an aside step: that one is itself a pause's)."""
        if not self._midstep or self.runner.in_aside:
            return self.runner.sample(plan, hidden)
        return drive(self.runner.sample_stages(plan, hidden), self._between)

    def _between(self) -> None:
        """Between the code predictor's sub-steps of the step in flight: take new requests and prefill them now. Not
        inside a step that makes first frames itself: its own new requests would wait behind the newer ones."""
        if not self._midstep_open:
            return
        while not self.inbox.empty():
            cmd = self.inbox.get_nowait()
            if isinstance(cmd, Submit) and self.dead is None:
                self._handle(cmd)
            else:
                self._deferred.append(cmd)
        if self.scheduler.waiting and self.scheduler.free_slots:
            self._run_aside()

    def _run_aside(self) -> None:
        """schedule the waiting → forward → sample → snapshot → publish at once, inside the step in flight."""
        plan = self.scheduler.schedule_aside()
        if plan is None:
            return
        timing = StepTiming(step=self._step, start=time.perf_counter(), contiguous=False)
        try:
            with self.runner.aside():
                self.runner.prepare(plan)
                codes = self._forward_and_sample(plan, timing)
        except Exception as exc:
            log.error("mid-step prefill at step %d failed for %d request(s): %r", self._step, len(plan.batch), exc)
            self.scheduler.commit(plan, self._step)
            for seq in plan.batch:
                self.scheduler.finish(seq)
            self._publish_failure(list(plan.batch), exc, fatal=False)
            if _is_device_fatal(exc):
                raise  # the step in flight fails too, and the engine stops
            return
        self.scheduler.commit(plan, self._step)
        self._publish(self._snapshot(plan, codes, timing))

    def _forward_and_sample(self, plan: StepPlan, timing: StepTiming) -> torch.Tensor:
        if self.fault_hook is not None:
            self.fault_hook("step", plan.batch)
        timing.forward_start = time.perf_counter()
        timing.gpu_forward_start = self.device.gpu_mark()
        hidden = self.runner.forward(plan, self._step)
        timing.forward_end = time.perf_counter()
        if self.fault_hook is not None:
            self.fault_hook("code_predictor", plan.batch)
        codes = self._sample(plan, hidden)
        timing.gpu_sample_end = self.device.gpu_mark()
        timing.sample_end = time.perf_counter()
        return codes

    def _step_failed(self, plan: StepPlan, exc: Exception) -> None:
        log.error("talker step %d failed for %d request(s): %r", self._step, len(plan.batch), exc)
        self._failures += 1
        fatal = self._failures >= MAX_CONSECUTIVE_FAILURES or _is_device_fatal(exc)
        self.scheduler.commit(plan, self._step)
        for seq in plan.batch:
            self.scheduler.finish(seq)
        self.scheduler.expire(self._step)  # those prefilled mid-step did not fail: their limits still hold
        if self.scheduler.starved:
            self._keep_starved()
        self._publish_failure(list(plan.batch), exc, fatal=False)
        self._step += 1
        if fatal:
            raise RuntimeError(f"engine stopped after repeated step failures: {exc!r}") from exc

    def _publish_failure(self, seqs: list[Seq], exc: BaseException, fatal: bool) -> None:
        self.publisher.publish(StepSnapshot(self._step, rows_of(seqs), None, error=exc, fatal=fatal))

    def _die(self, exc: BaseException) -> None:
        self.dead = exc
        seqs = self.scheduler.all_seqs()
        for seq in seqs:
            seq.status = SeqStatus.DONE
        self._publish_failure(seqs, exc, fatal=True)
        # Anything submitted after death is failed as it arrives.
        self._running = True
        while True:
            cmd = self.inbox.get()
            if isinstance(cmd, Stop):
                return
            self._handle(cmd)


def _is_device_fatal(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "cuda error" in text or "device-side assert" in text or "out of memory" in text


def rows_of(seqs: tuple[Seq, ...] | list[Seq]) -> tuple[Row, ...]:
    """What the output side learns of a step's rows: ids and segments."""
    return tuple((seq.request_id, seq.sink, seq.segment) for seq in seqs)

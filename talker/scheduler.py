"""Host-side bookkeeping of the Talker's slots: who waits, who runs, who is paused. Worker thread only.

Per-step host work is O(1): a sequence's frame count and KV length follow from the step it joined at, and the
step at which it reaches its limit is filed in a dict when it joins.

A sequence keeps its slot but is not stepped while its reader is behind (paused) or while its text, arriving over
time, has run out (starved: each frame takes the next text token). Its frame count stops meanwhile: the time spent
held shifts its join step forward. A starved sequence gives its slot up when queued work wants one and none is free:
it is parked (the worker keeps a host copy of what its slot held, talker/parking.py), queued again when its text
comes, ahead of new requests, and resumes in whatever slot it gets as if it had been held there.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice
from typing import Any

from common.request import SamplingParams
from talker.models.qwen3_tts.prompt import PromptIds


class SeqStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"
    PARKED = "parked"  # starved, its slot given to queued work
    DONE = "done"


@dataclass(slots=True, eq=False)
class TextFeed:
    """The text of a request that arrives while it is spoken, as the worker has received it."""

    tokens: list[int]  # the text's tokens after the first (which is in the prompt); frame k takes tokens[k - 1]
    done: bool = False  # the text has ended: tts_eos follows its last token
    written: int = 0  # positions of the slot's text row written (tokens, then tts_eos)

    def row(self, eos: int) -> list[int]:
        """The text fed at frames 1, 2, ... as far as it is known."""
        return [*self.tokens, eos] if self.done else self.tokens


@dataclass(slots=True, eq=False)
class Seq:
    """One request as the worker sees it. `sink` is the output side's key for it (the engine's: an int), opaque
    here and carried in each step's snapshot; tests driving the runner directly collect codes in it."""

    request_id: str
    prompt: PromptIds
    params: SamplingParams
    seed: int
    max_frames: int
    sink: Any
    segment: int = 0  # which of its request's segments (a long text is spoken as several, one after another)
    slot: int = -1
    status: SeqStatus = SeqStatus.WAITING
    prefill_len: int = 0
    join_step: int = 0  # the step that prefilled it (shifted forward by time spent paused)
    paused_at: int = 0
    pause_on_join: bool = False  # asked to pause while it waited for a slot: it pauses right after its prefill
    deadline: int = -1  # the last step it runs
    feed: TextFeed | None = None  # a text that arrives over time (None: the whole text is in the prompt)
    reader_paused: bool = False
    starved: bool = False  # it has made every frame its text so far allows
    starves: bool = False  # its deadline is where its text runs out, not a limit
    parked: Any = None  # while parked: the host copy of what its slot held (the worker's; talker/parking.py)

    def frames_after(self, step: int) -> int:
        return step - self.join_step + 1

    @property
    def held_kv_len(self) -> int:
        """The KV positions a held sequence has written: its prompt's, and one per frame after the first."""
        return self.prefill_len + self.paused_at - self.join_step - 1


@dataclass(slots=True)
class StepPlan:
    decode: list[Seq]
    prefill: list[Seq]
    version: int
    batch: tuple[Seq, ...]  # decode rows, then prefill rows
    kv_offset: int  # decode rows attend to kv_offset + step positions at most


class Scheduler:
    def __init__(self, max_batch: int, max_prefills: int, max_len: int, max_prefill_tokens: int = 2048) -> None:
        self.max_batch, self.max_prefills, self.max_len = max_batch, max_prefills, max_len
        self.max_prefill_tokens = max_prefill_tokens
        self.free_slots = list(range(max_batch))  # a heap: the lowest free slot goes first (batches stay packed)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.by_id: dict[str, Seq] = {}
        self.version = 0
        self._deadlines: defaultdict[int, list[Seq]] = defaultdict(list)
        self._plan = StepPlan([], [], 0, (), 0)
        self.starved: list[Seq] = []  # starved by the last step: the worker tells the runner, then clears it
        self.hungry: dict[Seq, None] = {}  # starved in a slot, longest first: parked when the queue wants slots
        self.parked: dict[Seq, None] = {}  # parked until more of their text comes
        self.resuming: deque[Seq] = deque()  # parked, their text come: they take free slots before new requests

    @property
    def active(self) -> int:
        return len(self.running)

    def add(self, seq: Seq) -> None:
        """Queue `seq`. A long text's next segment goes first: its request is already playing, and waiting behind
        newer requests would be a silence in the middle of its audio."""
        if seq.segment > 0:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)
        self.by_id[seq.request_id] = seq

    def has_work(self) -> bool:
        return bool(self._plan.decode) or bool(self.waiting and self.free_slots) or self.reslot_due()

    def reslot_due(self) -> bool:
        """Parked sequences can have a free slot back, or queued work can have a starved one's."""
        return bool(self.resuming and self.free_slots) or (bool(self.hungry) and self._wanted() > 0)

    def _wanted(self) -> int:
        return len(self.waiting) + len(self.resuming) - len(self.free_slots)

    def to_park(self) -> list[Seq]:
        """The starved sequences whose slots queued work wants, longest starved first."""
        return list(islice(self.hungry, max(0, min(self._wanted(), len(self.hungry)))))

    def park(self, seq: Seq) -> None:
        """`seq` (starved) gives its slot up; the worker has copied out what the slot held for it."""
        del self.hungry[seq]
        self.running.remove(seq)  # held: not in the decode plan
        heapq.heappush(self.free_slots, seq.slot)
        seq.status, seq.slot = SeqStatus.PARKED, -1
        self.parked[seq] = None

    def resume(self, step: int) -> list[Seq]:
        """Parked sequences whose text came take free slots, stepped from `step` on (held still if their reader is
        behind). The worker copies their slots' state back before that step."""
        resumed: list[Seq] = []
        while self.resuming and self.free_slots:
            seq = self.resuming.popleft()
            seq.slot, seq.status, seq.starved = heapq.heappop(self.free_slots), SeqStatus.PAUSED, False
            self.running.append(seq)
            self._release(seq, step)
            resumed.append(seq)
        return resumed

    def schedule(self) -> StepPlan:
        if not (self.waiting and self.free_slots):
            return self._plan
        prefill = self._admit()
        # new requests' prefill is a step of its own: the running rows sit it out (their first frame is not a
        # 32-row step's), and no step mixes prefill rows with decode rows
        self._skip(self._plan.decode)
        return StepPlan([], prefill, self.version, tuple(prefill), self._plan.kv_offset)

    def schedule_aside(self) -> StepPlan | None:
        """A prefill-only plan for the waiting requests, run inside the step in flight: they count as joining at
        that step, and the running sequences' frame counts do not move."""
        if not (self.waiting and self.free_slots):
            return None
        prefill = self._admit()
        return StepPlan([], prefill, self.version, tuple(prefill), 0)

    def _admit(self) -> list[Seq]:
        prefill: list[Seq] = []
        longest = 0
        while self.waiting and self.free_slots and len(prefill) < self.max_prefills:
            # prompts are right-padded to the longest: the step costs (count x longest) positions
            longest = max(longest, self.waiting[0].prompt.token_bound)
            if prefill and (len(prefill) + 1) * longest > self.max_prefill_tokens:
                break
            seq = self.waiting.popleft()
            seq.slot = heapq.heappop(self.free_slots)
            seq.status = SeqStatus.RUNNING
            prefill.append(seq)
        self.version += 1
        return prefill

    def _skip(self, seqs: list[Seq]) -> None:
        """Running sequences sit out one step: their frame count and last step move on by one."""
        for seq in seqs:
            seq.join_step += 1
            self._file_deadline(seq)

    def advance(self, plan: StepPlan, step: int) -> None:
        """After a step: new sequences join the decode batch; those whose last step this was finish."""
        if plan.prefill:
            self.commit(plan, step)
        if step in self._deadlines:
            self.expire(step)

    def commit(self, plan: StepPlan, step: int) -> None:
        """Prefilled sequences join the decode batch (appended, so row order is stable)."""
        if plan.prefill:
            for seq in plan.prefill:
                seq.join_step = step
                self._file_deadline(seq)
            self.running.extend(plan.prefill)
            self._rebuild()
            for seq in plan.prefill:
                if seq.pause_on_join:  # its next frame would have been the next step's
                    seq.reader_paused = True
                    self._hold(seq, step + 1)

    def expire(self, step: int) -> None:
        """Finish the sequences whose last step was `step`; those whose text ran out there wait for more."""
        for seq in self._deadlines.pop(step, ()):
            if seq.deadline != step:
                continue
            if seq.starves:
                seq.starved = True
                self._hold(seq, step + 1)
                self.starved.append(seq)
                self.hungry[seq] = None
            else:
                self.finish(seq)

    def fed(self, seq: Seq, step: int) -> None:
        """More of `seq`'s text (or its end) arrived before `step`: it runs on, or again (parked: it is queued)."""
        if seq.status is SeqStatus.PARKED:
            if seq in self.parked:  # else it is already queued
                del self.parked[seq]
                self.resuming.append(seq)
        elif seq.starved:
            seq.starved = False
            del self.hungry[seq]
            self._release(seq, step)
        elif seq.status is SeqStatus.RUNNING:
            self._file_deadline(seq)

    def _file_deadline(self, seq: Seq) -> None:
        by_frames = seq.join_step + seq.max_frames - 1
        by_length = seq.join_step + self.max_len - 2 - seq.prefill_len
        last = min(by_frames, by_length)
        feed = seq.feed
        # frame k takes text token k: with n tokens after the first, frame n is the last one the text allows
        seq.starves = feed is not None and not feed.done and seq.join_step + len(feed.tokens) < last
        seq.deadline = seq.join_step + len(feed.tokens) if seq.starves and feed is not None else last
        self._deadlines[seq.deadline].append(seq)

    def _rebuild(self) -> None:
        decode = [s for s in self.running if s.status is SeqStatus.RUNNING]
        kv_offset = max((s.prefill_len - s.join_step for s in decode), default=0)
        self.version += 1
        self._plan = StepPlan(decode, [], self.version, tuple(decode), kv_offset)

    def finish(self, seq: Seq) -> bool:
        """Free whatever `seq` holds. False if it was already finished."""
        if seq.status is SeqStatus.DONE:
            return False
        was = seq.status
        seq.status = SeqStatus.DONE
        seq.deadline = -1
        if self.by_id.get(seq.request_id) is seq:  # the next segment's Seq may already be filed under the id
            del self.by_id[seq.request_id]
        self.hungry.pop(seq, None)
        if was is SeqStatus.WAITING:
            self.waiting.remove(seq)
            return True
        if was is SeqStatus.PARKED:
            seq.parked = None
            if seq in self.parked:
                del self.parked[seq]
            else:
                self.resuming.remove(seq)
            return True
        if seq in self.running:
            self.running.remove(seq)
            self._rebuild()
        heapq.heappush(self.free_slots, seq.slot)
        return True

    def set_paused(self, seq: Seq, paused: bool, step: int) -> None:
        """Its reader is behind (or caught up) before `step`."""
        if seq.status is SeqStatus.WAITING:
            seq.pause_on_join = paused
            return
        if seq.status is SeqStatus.PARKED:  # it resumes held if its reader is behind then
            seq.reader_paused = paused
            return
        seq.reader_paused = paused
        if paused:
            self._hold(seq, step)
        else:
            self._release(seq, step)

    def _hold(self, seq: Seq, step: int) -> None:
        """`seq` keeps its slot but is not stepped from `step` on."""
        if seq.status is SeqStatus.RUNNING and seq in self.running:
            seq.status, seq.paused_at, seq.deadline = SeqStatus.PAUSED, step, -1
            self._rebuild()

    def _release(self, seq: Seq, step: int) -> None:
        """Stepped again from `step`, unless something else still holds it; its frame count did not move."""
        if seq.status is SeqStatus.PAUSED and not seq.reader_paused and not seq.starved:
            seq.status = SeqStatus.RUNNING
            seq.join_step += step - seq.paused_at
            self._file_deadline(seq)
            self._rebuild()

    def find(self, request_id: str, segment: int | None = None) -> Seq | None:
        """A request's live Seq: its latest, or that of `segment` (an earlier one may still be stepped)."""
        found = self.by_id.get(request_id)
        if segment is None or (found is not None and found.segment == segment):
            return found
        return next((s for s in self.all_seqs() if s.request_id == request_id and s.segment == segment), None)

    def all_seqs(self) -> list[Seq]:
        return [*self.running, *self.waiting, *self.parked, *self.resuming]

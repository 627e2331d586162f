"""Host-side bookkeeping of the Talker's slots: who waits, who runs, who is paused. Worker thread only."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from talker.models.qwen3_tts.prompt import PromptIds
from talker.request import SamplingParams


class SeqStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"


@dataclass(slots=True, eq=False)
class Seq:
    """One request as the worker sees it. `sink` is the output side's per-request object, opaque here."""

    request_id: str
    prompt: PromptIds
    params: SamplingParams
    seed: int
    max_frames: int
    sink: Any
    slot: int = -1
    length: int = 0
    frames: int = 0
    status: SeqStatus = SeqStatus.WAITING
    prefill_len: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class StepPlan:
    decode: list[Seq]
    prefill: list[Seq]
    version: int

    @property
    def batch(self) -> list[Seq]:
        return self.decode + self.prefill


class Scheduler:
    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self.free_slots = list(range(max_batch - 1, -1, -1))
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.by_id: dict[str, Seq] = {}
        self.version = 0
        self._decode: list[Seq] = []

    @property
    def active(self) -> int:
        return len(self.running)

    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)
        self.by_id[seq.request_id] = seq

    def has_work(self) -> bool:
        return bool(self.waiting and self.free_slots) or bool(self._decode) or any(
            s.status is SeqStatus.RUNNING for s in self.running
        )

    def schedule(self) -> StepPlan:
        prefill: list[Seq] = []
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            seq.status = SeqStatus.RUNNING
            prefill.append(seq)
        if prefill:
            self.version += 1
        return StepPlan(decode=self._decode, prefill=prefill, version=self.version)

    def commit(self, plan: StepPlan) -> None:
        """After a step: prefilled sequences join the decode batch (appended, so row order is stable)."""
        if plan.prefill:
            self.running.extend(plan.prefill)
            self._rebuild()

    def _rebuild(self) -> None:
        self._decode = [s for s in self.running if s.status is SeqStatus.RUNNING]
        self.version += 1

    def finish(self, seq: Seq) -> bool:
        """Free whatever `seq` holds. False if it was already finished."""
        if seq.status is SeqStatus.DONE:
            return False
        was_waiting = seq.status is SeqStatus.WAITING
        seq.status = SeqStatus.DONE
        self.by_id.pop(seq.request_id, None)
        if was_waiting:
            self.waiting.remove(seq)
            return True
        self.running.remove(seq)
        self.free_slots.append(seq.slot)
        self._rebuild()
        return True

    def set_paused(self, seq: Seq, paused: bool) -> None:
        if seq.status is SeqStatus.RUNNING and paused:
            seq.status = SeqStatus.PAUSED
            self._rebuild()
        elif seq.status is SeqStatus.PAUSED and not paused:
            seq.status = SeqStatus.RUNNING
            self._rebuild()

    def all_seqs(self) -> list[Seq]:
        return [*self.running, *self.waiting]

"""The one record of each live request, by request id, on the event loop (`LiveRequests`).

A record holds the request's output (its audio stream and what the output side keeps: `RequestOutput`), its text
while that still arrives (`SpeechInput`), its plan (a prepared text's segments, for the hand-over to the next one)
and whether it holds an admission place. Submission adds to it, the one admission check counts it, the output side
routes each snapshot row through it (`find`), the segment hand-over reads the plan from it, and the watchdog, the
aborts and the drain walk it. The worker keeps its own `Seq`s: only request ids cross the thread.

A request leaves when its stream is done (`sweep`, on every count) or when it is ended early (`end`: aborted,
failed, its reader gone; the engine then has the output side and the worker let go of it).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from common.request import EngineBusyError, EngineDeadError, EngineState, RequestError
from engine.text_input import SpeechInput
from frontend.frontend import Prepared
from output_builder.assembler import RequestOutput


@dataclass(eq=False)
class Live:
    output: RequestOutput
    plan: Prepared | None = None  # a prepared text: its segments, each handed over when the last one ends
    text: SpeechInput | None = None  # a text still arriving
    blank: bool = False  # a streamed text with no visible character yet: it holds no admission place


class LiveRequests:
    def __init__(self, capacity: int) -> None:
        """`capacity`: the admission places (Talker slots and queue together)."""
        self.capacity = capacity
        self._by_id: dict[str, Live] = {}

    def __len__(self) -> int:
        """The requests in flight (those whose stream is done leave first)."""
        self.sweep()
        return len(self._by_id)

    def get(self, request_id: str) -> Live | None:
        return self._by_id.get(request_id)

    def find(self, request_id: str, key: Hashable) -> RequestOutput | None:
        """The output a snapshot row goes to: the live request's, if the row's key (`Seq.sink`) is its stream's; a
        row of an ended request whose id was taken again goes nowhere."""
        live = self._by_id.get(request_id)
        return live.output if live is not None and live.output.stream_id == key else None

    def add(self, output: RequestOutput, plan: Prepared | None = None, blank: bool = False) -> Live:
        self._by_id[output.request_id] = live = Live(output, plan, blank=blank)
        return live

    def check_ids(self, ids: list[str]) -> None:
        """RequestError if an id repeats or is a live request's."""
        self.sweep()
        if len(set(ids)) != len(ids) or any(rid in self._by_id for rid in ids):
            raise RequestError("request_id is already in use", param="request_id")

    def check_admission(self, state: EngineState, dead_reason: str | None, n: int = 1) -> None:
        """The one admission check: EngineDeadError if the engine is not ready, EngineBusyError if `n` more would
        not fit. Every request in flight holds a place (waiting for text too, parked or not), but a streamed text
        still blank."""
        if state is EngineState.DEAD:
            raise EngineDeadError(f"the engine is dead: {dead_reason}")
        if state is not EngineState.READY:
            raise EngineDeadError(f"the engine is {state.value}")
        if len(self) - sum(live.blank for live in self._by_id.values()) + n > self.capacity:
            raise EngineBusyError("the server is at capacity; retry shortly", retry_after_s=1.0)

    def end(self, request_id: str) -> Live | None:
        """Ends a request early: it leaves. Returns its record (None if it had left)."""
        return self._by_id.pop(request_id, None)

    def sweep(self) -> None:
        for rid in [rid for rid, live in self._by_id.items() if live.output.stream.done]:
            del self._by_id[rid]

    def outputs(self) -> list[RequestOutput]:
        return [live.output for live in self._by_id.values()]

    def texts(self) -> list[SpeechInput]:
        """The texts still arriving."""
        return [live.text for live in self._by_id.values() if live.text is not None and not live.text.finished]

    def first_due(self, slots: int) -> bool:
        """A request with a Talker slot has no chunk yet: its first chunk wants the codec within a step or two."""
        outs = self._by_id.values()
        return len(outs) <= slots and any(live.output.chunks == 0 and not live.output.closed for live in outs)

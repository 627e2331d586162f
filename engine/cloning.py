"""Clone prompts admitted like speech: one voice process encodes one reference at a time, so clones wait in two
bounded queues, one-off `ref_audio` clones and voice creations, served in turn (a creation waits behind at most one
one-off clone, however many are queued). A full queue is EngineBusyError (429 with Retry-After). A recent
reference (the same samples and transcript) comes from a cache without running the encoders, and the same
reference asked for again while it is queued waits for that one run."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from common.request import ClonePrompt, EngineBusyError, EngineDeadError
from engine.voices.process import VoiceProcess

CloneKind = Literal["one_off", "creation"]
KINDS: tuple[CloneKind, CloneKind] = ("one_off", "creation")
# prompts kept by reference: an x-vector (1-2 K floats) and, in context, a 30 s reference's codes (360 x 16 ints);
# a few MiB at most, and enough for the voices a server's clients keep sending as `ref_audio`
CACHE_SIZE = 64
STOP_TIMEOUT_S = 10.0  # a clone being encoded when the engine stops gets this long to finish
FIRST_ESTIMATE_S = 1.0  # a clone's time before any has been measured (Retry-After)
_NAMES = {"one_off": "one-off voice clones (ref_audio)", "creation": "voice creations"}


def reference_key(wav: np.ndarray, transcript: str | None) -> bytes:
    """The samples and the transcript (none and empty are the same: x-vector only)."""
    digest = hashlib.blake2b(digest_size=20)
    text = (transcript or "").encode()
    digest.update(len(text).to_bytes(8, "little") + text)
    digest.update(np.ascontiguousarray(wav, np.float32).tobytes())
    return digest.digest()


@dataclass(eq=False, slots=True)
class _Job:
    key: bytes
    kind: CloneKind
    wav: np.ndarray
    transcript: str | None
    done: asyncio.Future[ClonePrompt]
    waiters: int = field(default=0)


class Cloning:
    """The engine's clone queue and cache, on the event loop; the encoding runs on a thread of its own that waits
    for the voice process. `waiting` clones per kind at most wait beside the one being encoded."""

    def __init__(self, process: VoiceProcess, waiting: int) -> None:
        self.process = process
        self.waiting = waiting
        self._queues: dict[CloneKind, deque[_Job]] = {kind: deque() for kind in KINDS}
        self._jobs: dict[bytes, _Job] = {}  # queued or being encoded, by reference
        self._running: _Job | None = None
        self._turn: CloneKind = "one_off"
        self._cache: OrderedDict[bytes, ClonePrompt] = OrderedDict()
        self._seconds = FIRST_ESTIMATE_S  # a recent clone's time, for Retry-After
        self._task: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(1, "voice-encoder")
        self._closed = False

    @property
    def jobs(self) -> int:
        """Clones admitted and not finished: queued, or being encoded."""
        return len(self._jobs)

    async def prompt(self, wav: np.ndarray, transcript: str | None, kind: CloneKind) -> ClonePrompt:
        key = await asyncio.to_thread(reference_key, wav, transcript)  # a 30 s reference is ~3 MB to hash
        if (cached := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            return cached
        job = self._jobs.get(key) or self._admit(key, kind, wav, transcript)
        job.waiters += 1
        try:
            return await asyncio.shield(job.done)
        finally:
            job.waiters -= 1
            if not job.waiters and job is not self._running and not job.done.done():
                self._queues[job.kind].remove(job)  # every caller has gone: nobody wants it
                del self._jobs[job.key]

    def _admit(self, key: bytes, kind: CloneKind, wav: np.ndarray, transcript: str | None) -> _Job:
        if self._closed:
            raise EngineDeadError("the engine stopped")
        queue = self._queues[kind]
        if self._jobs and len(queue) >= self.waiting:  # an idle voice process takes one at once
            ahead = len(queue) + len(self._queues[KINDS[kind == "one_off"]]) + 1
            raise EngineBusyError(f"{len(queue)} {_NAMES[kind]} are already waiting for the voice encoder; retry "
                                  "shortly", retry_after_s=max(1.0, ahead * self._seconds))
        job = _Job(key, kind, wav, transcript, asyncio.get_running_loop().create_future())
        queue.append(job)
        self._jobs[key] = job
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._serve(), name="voice-encoder")
        return job

    def _next(self) -> _Job | None:
        """The kinds in turn, so that neither waits behind the other's whole queue."""
        for kind in (self._turn, KINDS[self._turn == "one_off"]):
            if self._queues[kind]:
                self._turn = KINDS[kind == "one_off"]  # the other kind goes next
                return self._queues[kind].popleft()
        return None

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while (job := self._next()) is not None:
            self._running, start = job, time.monotonic()
            try:
                prompt = await loop.run_in_executor(self._thread, self.process.prompt, job.wav, job.transcript)
            except Exception as exc:
                job.done.set_exception(exc)
            else:
                self._seconds = time.monotonic() - start
                self._cache[job.key] = prompt
                if len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
                job.done.set_result(prompt)
            finally:
                self._running = None
                del self._jobs[job.key]

    async def close(self) -> None:
        """Queued clones fail (EngineDeadError); the one being encoded gets STOP_TIMEOUT_S to finish; the voice
        process stops."""
        self._closed = True
        for queue in self._queues.values():
            while queue:
                job = queue.popleft()
                del self._jobs[job.key]
                job.done.set_exception(EngineDeadError("the engine stopped"))
        if self._task is not None:
            await asyncio.wait([self._task], timeout=STOP_TIMEOUT_S)
        await asyncio.to_thread(self.process.close)
        self._thread.shutdown(wait=False)

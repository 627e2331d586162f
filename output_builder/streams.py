"""Bounded per-request audio streams: the only thing a client's handler reads from.

A stream buffers PCM ahead of its reader. Past `max_ahead_s` it asks the engine to pause its request; once the
reader drains half of that, it asks to resume. Lives on the event loop.

A request that asked for word timestamps also gets each segment's `Timestamps` in the same queue, after that
segment's audio; its stream ends only once every segment's have come (`expect_words`), unless it is cancelled or
fails. Readers of audio alone (`async for`) never see them; `events()` gives both.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from common.request import FinishReason


@dataclass(slots=True)
class Usage:
    frames: int = 0
    samples: int = 0
    sample_rate: int = 24000
    input_tokens: int = 0  # the input's (and instructions') text tokens

    @property
    def audio_seconds(self) -> float:
        return self.samples / self.sample_rate


@dataclass(frozen=True, slots=True)
class Timestamps:
    """One segment's words and when they are heard: seconds from the start of the response's audio."""

    segment: int
    text: str  # the segment's text as spoken
    start: float  # the segment's audio: its first sample's time
    end: float  # and its last's end
    words: tuple[tuple[str, float, float], ...]  # (word, start, end)
    error: str | None = None  # the aligner failed on this segment (its words are then missing)


class AudioStream:
    """Async iterator of int16 mono PCM chunks. `cancel()` aborts the request; it is idempotent."""

    def __init__(
        self, request_id: str, sample_rate: int, max_ahead_s: float,
        on_cancel: Callable[[str], None], on_pace: Callable[[str, bool], None],
    ) -> None:
        self.request_id = request_id
        self.sample_rate = sample_rate
        self.usage = Usage(sample_rate=sample_rate)
        self.transcript: str | None = None  # the text as spoken (respelled), when it is known whole at the start
        self.language: str | None = None  # the language it is spoken in (named, or detected), when known
        self.finish_reason: FinishReason | None = None
        self.error: BaseException | None = None
        self.created = time.monotonic()
        self.first_audio_at: float | None = None
        self.plays_until = 0.0  # monotonic time at which a client playing since its first audio runs out
        self.last_read = self.created
        self._chunks: deque[np.ndarray | Timestamps] = deque()
        self._words_due = 0  # segments whose timestamps are still being made
        self._ending: tuple[FinishReason, BaseException | None] | None = None  # a finish waiting for them
        self._buffered = 0
        self._high = int(max_ahead_s * sample_rate)
        self._paused = False
        self._wakeup = asyncio.Event()
        self._on_cancel, self._on_pace = on_cancel, on_pace

    # Producer side (event loop) -------------------------------------------------------------------
    def put(self, pcm: np.ndarray) -> None:
        if self.finish_reason is not None or pcm.size == 0:
            return
        now = time.monotonic()
        if self.first_audio_at is None:
            self.first_audio_at = now
        # a player that plays whatever it has, from the first audio on, and waits when it runs out: it ends here
        self.plays_until = max(self.plays_until, now) + pcm.size / self.sample_rate
        self._chunks.append(pcm)
        self._buffered += pcm.size
        self.usage.samples += pcm.size
        self._wakeup.set()
        if not self._paused and self._buffered > self._high:
            self._paused = True
            self._on_pace(self.request_id, True)

    def finish(self, reason: FinishReason, error: BaseException | None = None) -> None:
        if self.finish_reason is not None:
            return
        if self._words_due and reason not in (FinishReason.CANCELLED, FinishReason.ERROR):
            self._ending = (reason, error)  # the last segments' timestamps come first
            return
        self.finish_reason, self.error = reason, error
        self._wakeup.set()

    def expect_words(self) -> None:
        """A segment's timestamps are being made: the stream does not end before they come (`put_words`)."""
        self._words_due += 1

    def put_words(self, words: Timestamps) -> None:
        self._words_due -= 1
        if self.finish_reason is None:
            self._chunks.append(words)
            self._wakeup.set()
        if not self._words_due and self._ending is not None:
            self.finish(*self._ending)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def paused(self) -> bool:
        """The engine was asked to pause the request until the reader catches up."""
        return self._paused

    @property
    def buffered_seconds(self) -> float:
        return self._buffered / self.sample_rate

    @property
    def time_to_first_audio(self) -> float | None:
        return None if self.first_audio_at is None else self.first_audio_at - self.created

    # Consumer side ------------------------------------------------------------------------------------
    def cancel(self) -> None:
        if self.finish_reason is None:
            self.finish(FinishReason.CANCELLED)
            self._chunks.clear()
            self._buffered = 0
            self._on_cancel(self.request_id)

    def __aiter__(self) -> AudioStream:
        return self

    async def __anext__(self) -> np.ndarray:
        while isinstance(item := await self._next(), Timestamps):
            pass
        return item

    async def events(self) -> AsyncIterator[np.ndarray | Timestamps]:
        """The audio and, in their place after it, each segment's timestamps."""
        with contextlib.suppress(StopAsyncIteration):
            while True:
                yield await self._next()

    async def _next(self) -> np.ndarray | Timestamps:
        while not self._chunks:
            if self.finish_reason is not None:
                if self.error is not None and self.finish_reason is FinishReason.ERROR:
                    raise self.error
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        pcm = self._chunks.popleft()
        if isinstance(pcm, Timestamps):
            return pcm
        self._buffered -= pcm.size
        self.last_read = time.monotonic()
        if self._paused and self._buffered <= self._high // 2:
            self._paused = False
            if self.finish_reason is None:
                self._on_pace(self.request_id, False)
        return pcm

    def idle_for(self, now: float) -> float:
        """Seconds the reader has left buffered audio unread (0 when nothing waits)."""
        return now - self.last_read if self._buffered else 0.0

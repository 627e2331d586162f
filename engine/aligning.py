"""Word timestamps: each segment's audio and text go to the aligner process as soon as the segment has been heard,
batched with whatever else is due by then, on a thread of its own that waits for the process. A segment's words come
back into its request's stream, after that segment's audio; a request that did not ask pays nothing.

The aligner process runs under SCHED_IDLE once loaded (engine/aligner/process.py): it takes what the Talker and the
codec leave, so timestamps may trail the audio under load, but the audio never waits for them. On CUDA the aligner
runs in this process instead, on that thread and a CUDA stream of its own (engine/aligner/on_device.py)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from common.request import RequestError, RequestFailedError, SpeechRequest, StreamingSpeechRequest
from engine.aligner.on_device import AlignerOnDevice
from engine.aligner.process import AlignerProcess
from engine.aligner.words import Clip
from output_builder.streams import AudioStream, Timestamps
from output_builder.timing import WordTimer
from talker.models.qwen3_tts.config import CheckpointError

log = logging.getLogger("talkstream.aligner")
MAX_BATCH_CLIPS = 8  # clips in one aligner call
MAX_BATCH_SECONDS = 60.0  # their audio at most (a clip longer than that goes alone)
STOP_TIMEOUT_S = 10.0  # a call in flight when the engine stops gets this long to finish


@dataclass(frozen=True, slots=True)
class _Due:
    stream: AudioStream
    segment: int
    clip: Clip
    offset: float  # seconds of the response's audio before the segment's first sample

    @property
    def seconds(self) -> float:
        return self.clip.pcm.shape[-1] / self.clip.rate

    def timestamps(self, words: list[tuple[str, float, float]], error: str | None = None) -> Timestamps:
        """Its words, from the clip's start to the response's."""
        at = self.offset
        return Timestamps(self.segment, self.clip.text, round(at, 3), round(at + self.seconds, 3),
                          tuple((w, round(start + at, 3), round(end + at, 3)) for w, start, end in words), error)


class Alignment:
    """The engine's alignment queue, on the event loop."""

    def __init__(self, process: AlignerProcess | AlignerOnDevice, sample_rate: int) -> None:
        self.process, self.rate = process, sample_rate
        self.languages: tuple[str, ...] = ()
        self.aligned = 0  # segments aligned
        self._due: deque[_Due] = deque()
        self._task: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(1, "aligner")

    async def start(self) -> None:
        """Starts the process, which loads the checkpoint: one that cannot be used stops the engine's start."""
        try:
            self.languages = await asyncio.to_thread(self.process.languages)
        except RequestFailedError as exc:
            raise CheckpointError(f"the aligner in {self.process.directory} cannot be used: {exc}") from None

    def timer(self, stream: AudioStream, texts: tuple[str, ...], languages: tuple[str | None, ...]) -> WordTimer:
        """What cuts a request's audio into its segments (`texts`, spoken in `languages`) and queues each."""

        def due(segment: int, pcm: np.ndarray, start: int) -> None:
            if segment >= len(texts) or stream.done:
                return
            stream.expect_words()
            self._due.append(_Due(stream, segment, Clip(pcm, self.rate, texts[segment], languages[segment]),
                                  start / self.rate))
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._serve(), name="aligner")

        return WordTimer(due)

    def _batch(self) -> list[_Due]:
        batch = [self._due.popleft()]
        seconds = batch[0].seconds
        while self._due and len(batch) < MAX_BATCH_CLIPS and seconds + self._due[0].seconds <= MAX_BATCH_SECONDS:
            seconds += self._due[0].seconds
            batch.append(self._due.popleft())
        return batch

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while self._due:
            batch = self._batch()
            live = [d for d in batch if not d.stream.done]  # a cancelled request's segments are not aligned
            for d in batch:
                if d.stream.done:
                    d.stream.put_words(d.timestamps([]))
            if not live:
                continue
            try:
                timed = await loop.run_in_executor(self._thread, self.process.align, [d.clip for d in live])
            except Exception as exc:
                log.warning("alignment of %d segment(s) failed: %s", len(live), exc)
                for d in live:
                    d.stream.put_words(d.timestamps([], str(exc)))
                continue
            self.aligned += len(live)
            for d, words in zip(live, timed, strict=True):
                d.stream.put_words(d.timestamps(words))

    async def close(self) -> None:
        """Segments still queued get no words; the call in flight gets STOP_TIMEOUT_S; the process stops."""
        while self._due:
            d = self._due.popleft()
            d.stream.put_words(d.timestamps([], "the engine stopped"))
        if self._task is not None:
            await asyncio.wait([self._task], timeout=STOP_TIMEOUT_S)
        await asyncio.to_thread(self.process.close)
        self._thread.shutdown(wait=False)


def check_timestamps(request: SpeechRequest, alignment: Alignment | None) -> None:
    """Refuses timestamps that cannot be made: no aligner served, or a text that arrives over time."""
    if not request.timestamps:
        return
    if alignment is None:
        raise RequestError("timestamps need an aligner, and this server has none: start it with --aligner "
                           "Qwen/Qwen3-ForcedAligner-0.6B (or TALKSTREAM_ALIGNER)", param="timestamps")
    if isinstance(request, StreamingSpeechRequest):
        raise RequestError("timestamps are made per segment of a whole text; a text that arrives over time has none "
                           "(send the text at once)", param="timestamps")

"""The publisher of sync mode (A/B measurement): the output work inline on the Talker worker thread."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from output_builder.assembler import ChunkJob
from output_builder.bridge import CodecTimeoutError
from output_builder.pipeline import OutputPipeline
from talker.snapshot import StepSnapshot

log = logging.getLogger("talkstream.output")


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
        for _, call in self.pipeline.batches(jobs):
            self._decode(call)
        if self.pipeline.waiting:  # no timers here: every look-ahead now, in a call of its own
            ahead, _ = self.pipeline.look_aheads(time.monotonic(), math.inf)
            if ahead:
                self._decode(ahead)

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

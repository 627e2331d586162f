"""The engine's watchdog, on the event loop: every WATCHDOG_PERIOD_S it drops requests whose reader went idle, ends
texts whose writer went quiet, too slow or too old, and finds a dead part: the worker thread or the codec process
gone. It outlives any bug in what it checks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from common.request import RequestFailedError
from engine.text_input import SpeechInput
from output_builder.assembler import RequestOutput
from output_builder.bridge import AsyncBridge
from output_builder.codec_process import CodecProcess
from output_builder.sync_bridge import SyncBridge
from talker.worker import TalkerWorker

log = logging.getLogger("talkstream.engine")
WATCHDOG_PERIOD_S = 0.5


async def watch(check: Callable[[float], None]) -> None:
    """Runs `check(now)` every WATCHDOG_PERIOD_S until cancelled."""
    while True:
        await asyncio.sleep(WATCHDOG_PERIOD_S)
        try:
            check(time.monotonic())
        except Exception:
            log.exception("engine watchdog check failed")


def drop_idle_readers(outputs: list[RequestOutput], timeout: float, now: float,
                      fail: Callable[[RequestOutput, BaseException], None]) -> None:
    for out in outputs:
        if out.stream.idle_for(now) > timeout:
            log.warning("dropping request %s: its reader was idle for %.0f s", out.request_id, timeout)
            fail(out, RequestFailedError("the client stopped reading audio", code="reader_timeout"))


def end_overdue_texts(texts: list[SpeechInput], timeout: float, now: float) -> None:
    """A text that is quiet, too slow or too old (`SpeechInput.overdue`) ends as if its writer had finished it."""
    for handle in texts:
        if handle.finished or handle.stream.done:
            continue
        if (why := handle.overdue(now, timeout)) is not None:
            log.warning("request %s: its text %s; ending it", handle.request_id, why.value)
            handle.time_out(why)


def dead_part(bridge: AsyncBridge | SyncBridge | None, worker: TalkerWorker | None,
              codec_process: CodecProcess | None, now: float) -> str | None:
    """What makes the engine dead, if anything: its worker thread or codec process gone (sync mode: a decode
    overdue fails its requests first, `SyncBridge.check_decode`)."""
    if isinstance(bridge, SyncBridge):
        bridge.check_decode(now)
    if worker is not None and not worker.alive:
        return "the talker worker thread exited"
    if codec_process is not None and not codec_process.alive:
        return "the codec process exited"
    return None

"""The engine's watchdog, on the event loop: every WATCHDOG_PERIOD_S it drops requests whose reader went idle, ends
texts whose writer went quiet, too slow or too old, and has the engine check that its worker thread and codec process
are alive. It outlives any bug in what it checks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from common.request import RequestFailedError
from engine.text_input import SpeechInput
from output_builder.assembler import RequestOutput

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

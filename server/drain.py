"""Graceful shutdown: stop admitting, let what is in flight finish within the shutdown timeout, cut the rest.

`DrainingServer` is uvicorn's server with one change: the first SIGTERM or SIGINT runs `drain()` *before* uvicorn
shuts down, so the listener stays open meanwhile and new requests get a 503 (not a refused connection):

1. New HTTP requests get 503 `server_shutting_down` with `Retry-After` and `Connection: close` (`DrainGate`;
   `/health` answers 503 `draining`, `/metrics` still answers); new WebSocket connections are refused with 503
   (`routes_realtime`); the engine admits nothing more.
2. Idle Realtime sessions are closed with 1012 (service restart) at once; a session with a response in flight
   gets it finished (`response.done` completed), then 1012.
3. In-flight HTTP streams and Realtime responses get up to the shutdown timeout to finish. Past it they are cut:
   an HTTP audio stream ends truncated (an SSE stream with an `error` event), a Realtime response with
   `response.done` failed (`server_shutting_down`) and then 1012. A connection still stuck after `CUT_GRACE_S`
   (a peer that does not read) is aborted.
4. Then uvicorn's own shutdown: the listener closes, idle connections close, the lifespan stops the engine (its
   worker threads and codec process end).

A second signal cuts the wait short (step 3 at once); a third makes uvicorn exit without waiting at all.
`talkstream serve` then returns 0 (uvicorn's habit of re-raising the signal is not kept). SIGHUP counts as SIGTERM:
a closed terminal or a supervisor's hangup gets the same drain, not the default instant death; except on a server
with a lexicon (`serve --lexicon`), where SIGHUP reads it again and nothing stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from server import errors
from server.state import ServerState

log = logging.getLogger("talkstream.server")
POLL_S = 0.05
CUT_GRACE_S = 3.0  # after the cut, for handlers to report it (a send stuck on a stalled reader gives up after 1 s)
OPEN_PATHS = ("/health", "/metrics")


class DrainGate:
    """While draining, every new HTTP request but /health and /metrics gets 503 in the OpenAI envelope."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.state.draining or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        err = errors.shutting_down()
        self.state.metrics.error(err.detail.type, err.detail.code)
        response = err.response()
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


async def drain(state: ServerState, timeout: float, hurry: Callable[[], bool] = lambda: False) -> bool:
    """Steps 1-3 above. True when everything in flight finished by itself (nothing was cut)."""
    state.draining = True
    for engine in state.engines.values():
        engine.stop_admitting()
    log.info("draining: %d response(s) in flight, %d session(s); waiting up to %g s",
             state.in_flight(), len(state.sessions), timeout)
    await asyncio.gather(*(s.drain() for s in list(state.sessions)))
    clean = await _wait_until(lambda: not state.in_flight(), timeout, hurry)
    if not clean:
        log.warning("shutdown: cutting %d response(s) still in flight", state.in_flight())
        await _cut(state)
    return clean


async def _cut(state: ServerState) -> None:
    err = errors.shutting_down()
    for speech in list(state.speeches):
        speech.cut(err)
    cuts = asyncio.gather(*(s.cut(err) for s in list(state.sessions)))
    await _wait_until(lambda: not state.speeches and not state.sessions, CUT_GRACE_S)
    for session in list(state.sessions):  # still open: its peer does not read
        session.abort()
    await cuts
    for engine in state.engines.values():  # whatever an engine still holds (nothing, unless a handler leaked it)
        await engine.drain(0)


async def _wait_until(done: Callable[[], bool], timeout: float, hurry: Callable[[], bool] = lambda: False) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline or hurry():
            return False
        await asyncio.sleep(POLL_S)
    return True


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining the app (`drain`) on the first signal before it shuts down."""

    def __init__(self, config: uvicorn.Config, state: ServerState, timeout: float) -> None:
        super().__init__(config)
        self.state, self.timeout = state, timeout
        self.signals = 0
        self.drained_cleanly: bool | None = None
        self._drain: asyncio.Task[None] | None = None
        self.reloads = 0  # SIGHUPs to a server with a lexicon, each a reload
        self._reloading: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGINT and SIGTERM handlers, plus SIGHUP (where there is one), restored afterwards."""
        hup = getattr(signal, "SIGHUP", None)
        if hup is None or threading.current_thread() is not threading.main_thread():  # signals: main thread only
            with super().capture_signals():
                yield
            return
        previous = signal.signal(hup, self.handle_hangup if self.state.has_lexicon else self.handle_exit)
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(hup, previous)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:  # a signal handler: only sets flags
        self.signals += 1
        if self.signals > 2:
            self.should_exit = self.force_exit = True

    def handle_hangup(self, sig: int, frame: FrameType | None) -> None:
        self.reloads += 1

    async def on_tick(self, counter: int) -> bool:
        if self.reloads and (self._reloading is None or self._reloading.done()):
            self.reloads = 0  # those that came during a reload are one more
            self._reloading = asyncio.create_task(self.state.reload_lexicons(), name="lexicon-reload")
        if self.signals and self._drain is None:
            log.info("shutting down: draining for up to %g s (signal again to cut it short)", self.timeout)
            self._drain = asyncio.create_task(self._drain_then_exit(), name="drain")
        return await super().on_tick(counter)

    async def _drain_then_exit(self) -> None:
        try:
            self.drained_cleanly = await drain(self.state, self.timeout, hurry=lambda: self.signals > 1)
        except Exception:
            log.exception("the drain failed; shutting down anyway")
        finally:
            self.should_exit = True

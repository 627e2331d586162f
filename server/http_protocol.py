"""uvicorn's httptools and WebSocket protocols, extended for hostile and stalled peers.

1. A handler can abort its connection. When a reader stops reading, a response's sends block on flow control. Once
   the engine has dropped such a request the handler gives up on it, but `transport.close()` (what uvicorn does
   after a failed response, or after a WebSocket close) waits for the write buffer to drain, which a stalled peer
   never lets happen: the socket, its buffers and (for a WebSocket) the session's task would stay until the peer
   goes. `abort()` drops the buffer and closes at once. The app finds it under `scope["extensions"][ABORT]`, for
   HTTP requests and WebSocket sessions.
2. A client must finish a request head within `HEAD_TIMEOUT_S` of connecting (or of its first byte after a
   response), and a request body must not stall for longer than that. uvicorn has neither timeout (only keep-alive,
   which it arms after a response): without them idle sockets pile up until the process runs out of files and
   every request, `/health` included, fails.
3. Past the connection limit (uvicorn's `limit_concurrency`) requests and WebSocket handshakes get 503 in the
   OpenAI error envelope with `Retry-After` and `Connection: close`, where uvicorn answers plain text (and lets
   WebSocket handshakes through).

`talkstream serve` and the test servers pass both classes to uvicorn through `uvicorn_options`.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Mapping
from typing import Any

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

from server import errors
from server.realtime.events import MAX_EVENT_CHARS

ABORT = "talkstream.abort"
HEAD_TIMEOUT_S = 10.0
UTF8_MAX_BYTES_PER_CHAR = 4
log = logging.getLogger("talkstream.server")


def too_many_connections() -> errors.ApiError:
    return errors.unavailable("the server has too many open connections; retry shortly", code="too_many_connections")


async def _over_limit(scope: Scope, receive: Receive, send: Send) -> None:
    response = too_many_connections().response()
    response.headers["Connection"] = "close"  # frees the connection: the point of the limit
    await response(scope, receive, send)


class AbortableHttpProtocol(HttpToolsProtocol):
    head_timeout_s = HEAD_TIMEOUT_S  # `uvicorn_options` makes a subclass with another value

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the limit is checked here, so that what is answered past it is ours (uvicorn's check is then never true)
        self.max_connections, self.limit_concurrency = self.limit_concurrency, None
        self._client_timer: asyncio.TimerHandle | None = None
        self._in_body = False
        self._upgraded = False

    # The client deadline: armed whenever the server waits for the client and uvicorn's keep-alive timer is not.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_client_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_client_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # cancels uvicorn's keep-alive timer, runs the parser callbacks below
        # Bytes after a response that finish no request head (a partial head, stray CRLFs) would otherwise leave the
        # connection with no timer at all. The head's deadline runs from its first byte and is never extended.
        if (self._client_timer is None and self.timeout_keep_alive_task is None and not self._upgraded
                and not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete)):
            self._arm_client_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope.setdefault("extensions", {})[ABORT] = {"abort": self.transport.abort}

    def on_headers_complete(self) -> None:
        upgrade = self.parser.should_upgrade() and self._should_upgrade()
        # a swap rather than a copy of uvicorn's method: it starts the task with `self.app`
        self.app = _over_limit if not upgrade and self._over_limit() else self.config.loaded_app
        super().on_headers_complete()
        self._cancel_client_timer()
        if not upgrade:  # a body may follow: it must keep coming (a stall timer, rearmed by every piece of it)
            self._in_body = True
            self._arm_client_timer()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self._in_body:
            self._arm_client_timer()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        self._cancel_client_timer()

    def handle_websocket_upgrade(self) -> None:
        self._upgraded = True  # the WebSocket protocol takes over (its pings find dead peers)
        self._cancel_client_timer()
        if self._over_limit():
            self._refuse_upgrade()
            return
        super().handle_websocket_upgrade()

    def _over_limit(self) -> bool:
        limit = self.max_connections
        over = limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit)
        if over:
            log.warning("over the connection limit (%s): answering 503", limit)
        return over

    def _refuse_upgrade(self) -> None:
        response = too_many_connections().response()
        head = [b"HTTP/1.1 503 Service Unavailable", *(b"%s: %s" % kv for kv in response.raw_headers),
                b"connection: close", b"", b""]
        self.transport.write(b"\r\n".join(head) + response.body)
        self.transport.close()

    def _arm_client_timer(self) -> None:
        self._cancel_client_timer()
        self._client_timer = self.loop.call_later(self.head_timeout_s, self._client_timed_out)

    def _cancel_client_timer(self) -> None:
        if self._client_timer is not None:
            self._client_timer.cancel()
            self._client_timer = None

    def _client_timed_out(self) -> None:
        self._client_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._in_body and (self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue)):
            self._arm_client_timer()  # the server is the one not reading (the app has not asked for the body yet)
            return
        log.debug("closing a connection whose client sent no complete request head or body in %g s",
                  self.head_timeout_s)
        self.transport.abort()  # a response buffered for this peer is not worth waiting for


class AbortableWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's default WebSocket protocol (with `websockets` installed) plus the abort extension."""

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)  # the app's task is created here but runs later: the scope can still change
        scope: dict[str, Any] | None = getattr(self, "scope", None)
        if scope is not None:  # None when the handshake was refused
            scope.setdefault("extensions", {})[ABORT] = {"abort": self.transport.abort}


def abort_of(scope: Mapping[str, Any]) -> Any:
    """The connection's abort callable, or None where the server does not offer one."""
    return scope.get("extensions", {}).get(ABORT, {}).get("abort")


def open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_open_file_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard limit (each connection holds a file); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. macOS refuses an infinite soft limit
            log.warning("could not raise the open file limit from %d: %s", soft, exc)
    return open_file_limit()


def default_max_connections() -> int:
    """Half the open-file limit. The other half keeps room for the process's own files and for connections past
    the limit, which must still be accepted to be answered 503 (a process out of files answers nothing)."""
    return max(1, open_file_limit() // 2)


def ws_max_size() -> int:
    """The largest WebSocket message the server reads: the largest Realtime event, in UTF-8 bytes. A larger frame
    is refused (close 1009) by its header, before it is buffered."""
    return MAX_EVENT_CHARS * UTF8_MAX_BYTES_PER_CHAR


def uvicorn_options(head_timeout_s: float = HEAD_TIMEOUT_S, max_connections: int | None = None) -> dict[str, Any]:
    """The protocol options `talkstream serve` and the test servers give `uvicorn.Config`.

    `max_connections` defaults to `default_max_connections()`, read now (after `raise_open_file_limit`).
    WebSocket permessage-deflate is off: audio deltas are base64 of PCM, which compresses little, and compressing
    them took over half of the event loop's busy time at 32 streams (py-spy of `talkstream serve`).
    """
    http: type[AbortableHttpProtocol] = AbortableHttpProtocol
    if head_timeout_s != AbortableHttpProtocol.head_timeout_s:
        http = type("AbortableHttpProtocol", (AbortableHttpProtocol,), {"head_timeout_s": head_timeout_s})
    return {"http": http, "ws": AbortableWebSocketProtocol, "ws_per_message_deflate": False,
            "ws_max_size": ws_max_size(),
            "limit_concurrency": max_connections if max_connections is not None else default_max_connections()}

"""uvicorn's httptools and WebSocket protocols plus one extension: a handler can abort its connection.

When a reader stops reading, a response's sends block on flow control. Once the engine has dropped such a request
the handler gives up on it, but `transport.close()` (what uvicorn does after a failed response, or after a
WebSocket close) waits for the write buffer to drain, which a stalled peer never lets happen: the socket, its
buffers and (for a WebSocket) the session's task would stay until the peer goes. `abort()` drops the buffer and
closes at once. The app finds it under `scope["extensions"][ABORT]`, for HTTP requests and WebSocket sessions.
`talkstream serve` and the test servers pass both classes to uvicorn through `uvicorn_options`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

ABORT = "talkstream.abort"


class AbortableHttpProtocol(HttpToolsProtocol):
    def on_message_begin(self) -> None:
        super().on_message_begin()
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope.setdefault("extensions", {})[ABORT] = {"abort": self.transport.abort}


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


def uvicorn_options() -> dict[str, Any]:
    """The protocol options `talkstream serve` and the test servers give `uvicorn.Config`.

    WebSocket permessage-deflate is off: audio deltas are base64 of PCM, which compresses little, and compressing
    them took over half of the event loop's busy time at 32 streams (py-spy of `talkstream serve`).
    """
    return {"http": AbortableHttpProtocol, "ws": AbortableWebSocketProtocol, "ws_per_message_deflate": False}

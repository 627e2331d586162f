"""uvicorn's httptools protocol plus one extension: a response can abort its connection.

When a reader stops reading, a response's sends block on flow control. Once the engine has dropped such a request
the handler gives up on it, but `transport.close()` (what uvicorn does after a failed response) waits for the write
buffer to drain, which a stalled peer never lets happen: the socket and its buffers would stay until the peer goes.
`abort()` drops the buffer and closes at once. The app finds it under `scope["extensions"][ABORT]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

ABORT = "talkstream.abort"


class AbortableHttpProtocol(HttpToolsProtocol):
    def on_message_begin(self) -> None:
        super().on_message_begin()
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope.setdefault("extensions", {})[ABORT] = {"abort": self.transport.abort}


def abort_of(scope: Mapping[str, Any]) -> Any:
    """The connection's abort callable, or None where the server does not offer one."""
    return scope.get("extensions", {}).get(ABORT, {}).get("abort")

"""The load client's HTTP connection for `talkstream bench serve`: one keep-alive HTTP/1.1 connection spoken with h11
over asyncio streams.

On the 2-core machines the load client shares the cores it measures. Through httpx a 32-stream level cost the
client about 1.3 s of CPU per 128 requests, against 0.5 s for the WebSocket client; h11 alone does the same work
with a fraction of the layers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from urllib.parse import urlsplit

import h11

READ_BYTES = 1 << 16


class HttpError(RuntimeError):
    """The connection broke: it cannot carry another request."""


class HttpStatusError(HttpError):
    """The server answered with something other than 200; the connection goes on."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                 headers: dict[str, str]) -> None:
        self._reader, self._writer = reader, writer
        self._h11 = h11.Connection(h11.CLIENT)
        self._headers = [("Host", host), *headers.items()]
        self._reusable = True

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str, headers: dict[str, str]) -> AsyncIterator[Connection]:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the HTTP load client speaks plain http://host:port, not {url!r}")
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        try:
            yield cls(reader, writer, parts.netloc, headers)
        finally:
            writer.close()
            with suppress(OSError):
                await writer.wait_closed()

    async def request(self, method: str, target: str, body: bytes = b"") -> AsyncIterator[bytes]:
        """Sends one request and yields the body of its 200 response as it arrives."""
        if not self._reusable:
            raise HttpError("the server closed the connection")
        headers = [*self._headers, ("Content-Length", str(len(body)))]
        if body:
            headers.append(("Content-Type", "application/json"))
        self._send(h11.Request(method=method, target=target, headers=headers), h11.Data(data=body),
                   h11.EndOfMessage())
        await self._writer.drain()
        response = await self._next()
        if not isinstance(response, h11.Response):
            raise HttpError(f"expected a response, got {type(response).__name__}")
        error = response.status_code != 200
        text = b""
        while not isinstance(event := await self._next(), h11.EndOfMessage):
            if isinstance(event, h11.Data):
                if error:
                    text += event.data
                elif event.data:
                    yield bytes(event.data)
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        else:  # the server asked to close
            self._reusable = False
        if error:
            raise HttpStatusError(f"HTTP {response.status_code}: {text[:200].decode(errors='replace')}")

    def _send(self, *events: h11.Event) -> None:
        for event in events:
            data = self._h11.send(event)
            if data:
                self._writer.write(data)

    async def _next(self) -> object:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise HttpError(f"protocol error: {exc}") from exc
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.ConnectionClosed):
                    raise HttpError("the server closed the connection")
                return event
            self._h11.receive_data(await self._reader.read(READ_BYTES))

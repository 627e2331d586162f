"""The bench's lean HTTP/1.1 load client (h11 over asyncio streams) against a live server."""

from __future__ import annotations

import json

import pytest

from benchmarks.http_client import Connection, HttpError, HttpStatusError
from tests.server.conftest import LiveServer


async def body_of(conn: Connection, method: str, target: str, payload: dict[str, object] | None = None) -> bytes:
    data = json.dumps(payload).encode() if payload is not None else b""
    return b"".join([piece async for piece in conn.request(method, target, data)])


async def test_one_connection_carries_requests_and_survives_an_error_status(live: LiveServer) -> None:
    async with Connection.open(live.url, {}) as conn:
        assert json.loads(await body_of(conn, "GET", "/health"))["status"] == "ready"
        with pytest.raises(HttpStatusError, match=r"HTTP 400.*invalid_request_error"):
            await body_of(conn, "POST", "/v1/audio/speech", {"model": "tiny", "input": "", "voice": "alloy"})
        pcm = await body_of(conn, "POST", "/v1/audio/speech",
                            {"model": "tiny", "input": "Still here.", "voice": "alloy", "response_format": "pcm"})
        assert len(pcm) > 0 and len(pcm) % 2 == 0


async def test_a_closed_connection_is_an_error_and_only_http_urls_are_taken(live: LiveServer) -> None:
    with pytest.raises(ValueError, match="plain http"):
        async with Connection.open("https://127.0.0.1:1", {}):
            pass
    async with Connection.open(live.url, {"Connection": "close"}) as conn:
        await body_of(conn, "GET", "/health")
        with pytest.raises(HttpError, match="the server closed the connection"):
            await body_of(conn, "GET", "/health")

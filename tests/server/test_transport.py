"""Transport-level defences against hostile or stalled clients (server/http_protocol.py): a deadline for request
heads and stalled bodies, a connection limit answered with an enveloped 503, a WebSocket frame limit enforced by the
frame header (close 1009), and the API docs served without a CDN."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import struct
from collections.abc import Callable, Iterator

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from server.http_protocol import ws_max_size
from tests.server.conftest import LiveServer
from tests.server.rawclient import CLOSE, LAST_CHUNK, raw_request, raw_ws, read_response, recv_frame
from tests.server.test_abort_paths import speech

HEAD_TIMEOUT_S = 1.0  # the test servers' (the default is 10 s)
MAX_CONNECTIONS = 4
CLOSE_DEADLINE_S = 30.0  # generous: the server closes after HEAD_TIMEOUT_S


def _address(server: LiveServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


@contextlib.contextmanager
def held(server: LiveServer, prefixes: list[bytes]) -> Iterator[list[socket.socket]]:
    """Sockets connected to the server, each having sent only its prefix (b"" for none)."""
    socks = []
    try:
        for prefix in prefixes:
            sock = socket.create_connection(_address(server))
            sock.sendall(prefix)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def closed_by_server(sock: socket.socket) -> bool:
    """Waits up to CLOSE_DEADLINE_S for the server to end the connection; False when it stays open."""
    sock.settimeout(CLOSE_DEADLINE_S)
    try:
        return sock.recv(4096) == b""  # an idle client sent no request: the server has nothing to answer
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # never finished
STALLED_BODY = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 500\r\n\r\n{")  # 1 byte of 500


def test_idle_sockets_past_the_limit_get_an_enveloped_503_and_are_closed(
        make_server: Callable[..., LiveServer]) -> None:
    server = make_server(options={"head_timeout_s": HEAD_TIMEOUT_S, "max_connections": MAX_CONNECTIONS})
    with held(server, [b""] * (MAX_CONNECTIONS + 2) + [PARTIAL_HEAD] * 2) as idle:
        health = httpx.get(server.url + "/health", timeout=10)  # answered, not refused or left hanging
        assert health.status_code == 503 and int(health.headers["retry-after"]) >= 1, health.text
        assert health.headers["connection"] == "close"
        assert set(health.json()["error"]) == {"message", "type", "param", "code"}
        assert health.json()["error"]["code"] == "too_many_connections"
        with pytest.raises(InvalidStatus) as denied:  # a WebSocket handshake past the limit: the same answer
            connect(server.ws_url, open_timeout=10)
        assert denied.value.response.status_code == 503
        assert json.loads(denied.value.response.body or b"")["error"]["code"] == "too_many_connections"
        assert all(closed_by_server(sock) for sock in idle)  # none ever finished a request head
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_a_stalled_body_is_closed_and_a_long_response_is_not(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(options={"head_timeout_s": HEAD_TIMEOUT_S})
    streaming = raw_request(server.url, speech(input="A sentence long enough to stream for a little while. " * 3))
    try:
        with held(server, [STALLED_BODY]) as [stalled]:
            assert closed_by_server(stalled)
        # by now the head timeout has passed for `streaming` too, whose request was complete: its response (not
        # read so far) is whole, and its connection is kept alive for the next request
        body = read_response(streaming, timeout=30)
        assert body.startswith(b"HTTP/1.1 200") and body.endswith(LAST_CHUNK)
        streaming.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _read_head(streaming).startswith(b"HTTP/1.1 200")
    finally:
        streaming.close()


def _read_head(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(4096)):
        data += chunk
    return data


def test_an_oversized_websocket_frame_is_refused_by_its_header(live: LiveServer) -> None:
    sock = raw_ws(live.url)
    try:
        # only the header of a frame one byte over the limit, no payload: the server must not wait for it
        sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack(">Q", ws_max_size() + 1) + os.urandom(4))
        sock.settimeout(30)
        opcode, payload = _first_non_text_frame(sock)
        assert opcode == CLOSE and struct.unpack(">H", payload[:2])[0] == 1009  # message too big
    finally:
        sock.close()
    assert httpx.get(live.url + "/health", timeout=10).status_code == 200


def _first_non_text_frame(sock: socket.socket) -> tuple[int, bytes]:
    while True:
        opcode, payload = recv_frame(sock)
        if opcode != 0x1:  # session.created comes first
            return opcode, payload


def test_a_frame_under_the_limit_gets_the_routes_error(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None, open_timeout=30) as conn:
        conn.recv(timeout=30)
        conn.send("z" * (ws_max_size() - 1))  # past the route's character limit, under the frame limit
        event = json.loads(conn.recv(timeout=30))
        assert event["type"] == "error" and event["error"]["code"] == "event_too_large"
        conn.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(conn.recv(timeout=30))["type"] == "session.updated"


ASSET = re.compile(rb"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|url:\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_load_nothing_from_elsewhere(live: LiveServer, page: str) -> None:
    html = httpx.get(live.url + page, timeout=10)
    assert html.status_code == 200
    urls = {(m.group(1) or m.group(2)).decode() for m in ASSET.finditer(html.content)}
    assert len(urls) >= 3, urls  # a script, a favicon, the schema (and Swagger UI's stylesheet)
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url  # same origin
        assert httpx.get(live.url + url, timeout=30).status_code == 200, url

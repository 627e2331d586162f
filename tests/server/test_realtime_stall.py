"""A Realtime client that stops reading: its response ends and frees everything the engine held for it."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from collections.abc import Callable

from tests.server.conftest import LiveServer
from tests.server.leaks import leak_counts, wait_no_leaks
from tests.server.test_abort_paths import LONG_TEXT


def raw_ws(url: str) -> socket.socket:
    """A WebSocket over a bare socket with a tiny receive buffer: after the handshake it reads nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/realtime HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    assert sock.recv(1024).startswith(b"HTTP/1.1 101")
    return sock


def send_text(sock: socket.socket, event: dict[str, object]) -> None:
    payload = json.dumps(event).encode()
    mask = os.urandom(4)
    n = len(payload)
    header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n))
    sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def test_a_stalled_realtime_reader_is_dropped(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(max_ahead_s=0.5, reader_timeout_s=1.0)
    for listener in server.server.servers:  # small send buffers, so the server's sends really block
        for sock in listener.sockets:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    client = raw_ws(server.url)
    try:
        send_text(client, {"type": "input_text_buffer.append", "text": LONG_TEXT})
        send_text(client, {"type": "input_text_buffer.commit"})
        open_ws = 'talkstream_open_responses{protocol="ws"}'
        deadline = time.monotonic() + 3
        while not leak_counts(server.url)[open_ws] and time.monotonic() < deadline:  # the response started
            time.sleep(0.05)
        deadline = time.monotonic() + 20
        counts = leak_counts(server.url)
        while any(counts.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            counts = leak_counts(server.url)
        assert not any(counts.values()), counts  # response ended; slot, stream and codec state freed
    finally:
        client.close()
    assert not (left := wait_no_leaks(server.url)), left

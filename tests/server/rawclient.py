"""Clients over bare sockets that read only when the test says so, and whose peer can buffer little for them.

A small receive buffer plus a small MSS keep the server's kernel send buffer small too (loopback's 64 KiB MSS
lets Linux grow it to megabytes), so a response to a client that is not reading really blocks in the server.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from typing import Any

CLOSE, TEXT = 0x8, 0x1


def stalling_socket(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1200)
    sock.connect((host, int(port)))
    return sock


def raw_request(url: str, payload: dict[str, Any]) -> socket.socket:
    sock = stalling_socket(url)
    data = json.dumps(payload).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def raw_ws(url: str) -> socket.socket:
    """A Realtime session: the handshake is read (and nothing after it)."""
    sock = stalling_socket(url)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += recv_exact(sock, 1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def send_text(sock: socket.socket, event: dict[str, object]) -> None:
    payload = json.dumps(event).encode()
    mask = os.urandom(4)
    n = len(payload)
    header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n))
    sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One unmasked frame from the server: (opcode, payload)."""
    b0, b1 = recv_exact(sock, 2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", recv_exact(sock, 2))[0]
    elif n == 127:
        n = struct.unpack(">Q", recv_exact(sock, 8))[0]
    return b0 & 0x0F, recv_exact(sock, n)


def events_until_close(sock: socket.socket) -> tuple[list[dict[str, Any]], int]:
    """Every server event up to the close frame, and the close code."""
    events = []
    while True:
        opcode, data = recv_frame(sock)
        if opcode == CLOSE:
            return events, struct.unpack(">H", data[:2])[0]
        if opcode == TEXT:
            events.append(json.loads(data))


LAST_CHUNK = b"\r\n0\r\n\r\n"


def read_response(sock: socket.socket, timeout: float) -> bytes:
    """A chunked response as far as it goes: up to its last chunk, or until the server ends the connection."""
    sock.settimeout(timeout)
    data = bytearray()
    try:
        while not data.endswith(LAST_CHUNK) and (chunk := sock.recv(65536)):
            data += chunk
    except ConnectionResetError:
        pass
    return bytes(data)

"""A Realtime client that stops reading: its response ends and frees everything the engine held for it, and its
connection is aborted, so the session's socket and task go too."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from tests.server.conftest import LiveServer
from tests.server.leaks import leak_counts, scrape, wait_no_leaks
from tests.server.rawclient import raw_ws, send_text
from tests.server.test_abort_paths import LONG_TEXT
from tests.server.test_load import peers

SESSIONS = "talkstream_realtime_sessions"


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
        deadline = time.monotonic() + 20  # failure timeouts only
        while not leak_counts(server.url)[open_ws]:  # the response started (it lasts at least reader_timeout_s)
            assert time.monotonic() < deadline, "the response never started"
            time.sleep(0.05)
        counts = leak_counts(server.url)
        while any(counts.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            counts = leak_counts(server.url)
        assert not any(counts.values()), counts  # response ended; slot, stream and codec state freed
        while client.getsockname() in peers(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.getsockname() not in peers(server)  # the server aborted the connection
        assert scrape(server.url)[SESSIONS] == 0  # and the session ended
    finally:
        client.close()
    assert not (left := wait_no_leaks(server.url)), left

"""Every way a client can go away frees everything it held: slots, streams, codec state, encoders, handlers."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from talker.scheduler import Seq
from tests.server.conftest import LiveServer
from tests.server.leaks import wait_no_leaks

LONG_TEXT = "This sentence keeps going on and on so that the audio lasts for a good while. " * 12
SAMPLES_PER_FRAME = 1920  # 24 kHz / 12.5 Hz


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Waits for `condition` (a failure bound, not a threshold)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def speech(**fields: Any) -> dict[str, Any]:
    return {"model": "tts-1", "input": LONG_TEXT, "voice": "alloy", "response_format": "pcm", "temperature": 0.0,
            **fields}


def raw_request(url: str, payload: dict[str, Any], rcvbuf: int | None = None) -> socket.socket:
    """An HTTP request over a bare socket, so the test decides exactly how the connection ends."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    data = json.dumps(payload).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def test_http_disconnect_mid_stream_frees_everything(live: LiveServer) -> None:
    for fmt in ("pcm", "mp3"):
        sock = raw_request(live.url, speech(response_format=fmt))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert live.stats()["slots_in_use"] == 1
        sock.close()
        assert not (counts := wait_no_leaks(live.url)), counts


def test_websocket_drop_without_close_frame_frees_everything(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None) as conn:
        conn.recv(timeout=30)
        conn.send(json.dumps({"type": "session.update", "session": {"temperature": 0.0}}))
        conn.send(json.dumps({"type": "input_text_buffer.append", "text": LONG_TEXT}))
        conn.send(json.dumps({"type": "input_text_buffer.commit"}))
        while json.loads(conn.recv(timeout=30))["type"] != "response.output_audio.delta":
            pass
        conn.socket.shutdown(socket.SHUT_RDWR)  # a dead peer: no close frame
        assert not (counts := wait_no_leaks(live.url)), counts


def test_response_cancel_frees_everything(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None) as conn:
        conn.recv(timeout=30)
        conn.send(json.dumps({"type": "input_text_buffer.append", "text": LONG_TEXT}))
        conn.send(json.dumps({"type": "input_text_buffer.commit"}))
        while json.loads(conn.recv(timeout=30))["type"] != "response.output_audio.delta":
            pass
        conn.send(json.dumps({"type": "response.cancel"}))
        while (event := json.loads(conn.recv(timeout=30)))["type"] != "response.done":
            pass
        assert event["response"]["status"] == "cancelled"
        assert not (counts := wait_no_leaks(live.url)), counts


def test_disconnect_while_queued_does_no_model_work(make_server: Callable[..., LiveServer]) -> None:
    """The Talker is held inside the running request's third step (the worker's test hook) while the queued request
    comes and its client goes: the running one cannot end and hand it the slot meanwhile, however fast the machine
    (its whole audio once fitted the kernel's buffers before the test had closed the queued request). Released, the
    worker reads the queued request's submit and its abort together, and never steps it."""
    server = make_server(max_batch=1, max_queue=4)
    stepped: set[str] = set()
    held, release = threading.Event(), threading.Event()
    steps = 0

    def record(stage: str, batch: tuple[Seq, ...]) -> None:
        nonlocal steps
        stepped.update(seq.request_id for seq in batch)
        if stage == "step":
            steps += 1
            if steps == 3:
                held.set()
                release.wait(60)

    assert server.engine.worker is not None
    server.engine.worker.fault_hook = record
    try:
        running = raw_request(server.url, speech(), rcvbuf=4096)
        assert running.recv(65536).startswith(b"HTTP/1.1 200")
        assert held.wait(30)
        queued = raw_request(server.url, speech(input="Never spoken."))
        until(lambda: server.engine.active_requests() == 2, "the queued request to be submitted")
        [queued_id] = [o.request_id for o in server.engine.live.outputs() if o.request_id not in stepped]
        queued.close()
        until(lambda: server.engine.active_requests() == 1, "the engine to end the queued request")
    finally:
        release.set()
    until(lambda: server.stats()["queued_requests"] == 0, "the worker to drop the queued request")
    running.close()
    assert not (counts := wait_no_leaks(server.url)), counts
    assert queued_id not in stepped and stepped


async def test_100_streams_with_10_cancelled(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(max_batch=64, max_queue=64)

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, int] | None:
        payload = speech(input=f"Stream number {i} says hello.", stream_format="sse", seed=i)
        pcm = b""
        async with client.stream("POST", "/v1/audio/speech", json=payload) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event["type"] == "speech.audio.delta":
                    pcm += base64.b64decode(event["audio"])
                    if i % 10 == 0:
                        return None  # leaves mid-stream: the response is cancelled
                elif event["type"] == "speech.audio.done":
                    usage = event["usage"]
                    assert len(pcm) == 2 * usage["samples"] == 2 * SAMPLES_PER_FRAME * usage["output_tokens"]
                    return len(pcm), usage["output_tokens"]
                else:
                    pytest.fail(f"unexpected event {event}")
        pytest.fail("the stream ended without speech.audio.done")

    limits = httpx.Limits(max_connections=128)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(100)))
    done = [r for r in results if r is not None]
    assert len(done) == 90 and all(frames > 0 for _, frames in done)
    assert not (counts := await asyncio.to_thread(wait_no_leaks, server.url)), counts

"""`talkstream serve` as a subprocess: a dead engine exits the process; SIGTERM drains, then exits in bounded time."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.server.test_abort_paths import raw_request, speech


class Served:
    def __init__(self, cache: Path, *flags: str) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "TALKSTREAM_CACHE_DIR": str(cache)}
        self.proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--port", str(self.port),
                                      "--log-level", "warning", *flags], env=env)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the server did not become ready")

    def children(self) -> list[int]:
        """Child processes (the codec process), whichever thread started them."""
        tasks = Path(f"/proc/{self.proc.pid}/task").glob("*/children")
        return [int(p) for path in tasks for p in path.read_text().split()]


@pytest.fixture
def serve(tiny_cache: Path, tiny_dir: Path) -> Iterator[type[Served]]:
    started: list[Served] = []

    def make(*flags: str) -> Served:
        s = Served(tiny_cache, *flags)
        started.append(s)
        return s

    yield make  # type: ignore[misc]
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
        s.proc.wait(10)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_a_dead_engine_exits_the_process(serve: type[Served]) -> None:
    server = serve()
    [codec] = server.children()
    os.kill(codec, signal.SIGKILL)  # the codec process dies: the engine cannot go on
    saw_503 = False
    deadline = time.monotonic() + 20
    while server.proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            saw_503 = saw_503 or httpx.get(server.url + "/health", timeout=1).status_code == 503
        time.sleep(0.1)
    assert server.proc.poll() == 3 and saw_503


def test_sigterm_drains_then_exits(serve: type[Served]) -> None:
    server = serve("--shutdown-timeout", "3")
    [codec] = server.children()
    with connect(server.url.replace("http", "ws") + "/v1/realtime") as ws:
        ws.recv(timeout=30)
        stalled = raw_request(server.url, speech())  # never read past the headers: aborted at the timeout
        assert stalled.recv(4096).startswith(b"HTTP/1.1 200")
        short: dict[str, bytes] = {}

        def finish_short() -> None:
            payload = speech(input="Finish me.")
            with httpx.stream("POST", server.url + "/v1/audio/speech", json=payload, timeout=30) as r:
                body = r.iter_raw()
                short["first"] = next(body)
                short["rest"] = b"".join(body)

        reader = threading.Thread(target=finish_short)
        reader.start()
        while "first" not in short and reader.is_alive():
            time.sleep(0.01)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        reader.join(30)
        assert short["rest"]  # the in-flight stream finished completely
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    # uvicorn re-raises the signal once its graceful shutdown is over: -SIGTERM is a clean exit here
    assert server.proc.wait(20) in (0, -signal.SIGTERM) and time.monotonic() - t0 < 3 * 2 + 5
    with pytest.raises(httpx.TransportError):
        httpx.post(server.url + "/v1/audio/speech", json=speech(), timeout=2)
    assert not alive(codec)
    stalled.close()

"""Live servers for the end-to-end tests: real uvicorn on 127.0.0.1 (a free port), in a background thread, serving
the session's tiny checkpoint. Running in-process lets tests read the engine's state directly."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from engine.config import EngineConfig
from engine.engine import Engine
from server.app import create_app
from server.guard import SitePolicy
from server.http_protocol import uvicorn_options
from server.state import state_of
from server.voices.store import Quota

API_KEY = "test-key-123"
READY_TIMEOUT_S = 120.0  # a failure bound: starts are slow under the whole suite's load
_DATA_DIR = Path(tempfile.gettempdir()) / f"talkstream-test-data-{os.getpid()}"


@dataclass
class LiveServer:
    url: str
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def engine(self) -> Engine:
        return state_of(self.app).engine

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/realtime"

    def stats(self) -> dict[str, int]:
        return self.engine.stats()

    def wait_idle(self, timeout: float = 10.0) -> dict[str, int]:
        """Waits until no request holds a slot or a queue entry; returns the last stats."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if (stats["active_requests"] == 0 and stats["slots_in_use"] == 0) or time.monotonic() > deadline:
                return stats
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(config: EngineConfig, api_key: str | None = None, wait_ready: bool = True,
                 options: dict[str, Any] | None = None, data_dir: Path | None = None,
                 quota: Quota | None = None, site: SitePolicy | None = None) -> LiveServer:
    """`options`: arguments of `uvicorn_options` (a shorter head timeout, a connection limit). `data_dir`: the voice
    library's; by default one of the test session's own, never the user's (the library makes its file on the first
    write, so a server that stores nothing leaves it empty), and `quota` what it may hold. `site`: the Hosts and
    origins it answers (server/guard.py; by default those of a server on 127.0.0.1, as it is)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY only then
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(config, api_key, shutdown_timeout=2.0, data_dir=data_dir or _DATA_DIR, voice_quota=quota,
                     site=site)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2,
                                           **uvicorn_options(**(options or {}))))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True,
                              name=f"uvicorn-{port}")
    thread.start()
    live = LiveServer(f"http://127.0.0.1:{port}", app, server, thread)
    if not wait_ready:
        return live
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(live.url + "/health", timeout=2).status_code == 200:
                return live
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    live.stop()
    raise RuntimeError("the test server did not become ready")


@pytest.fixture(scope="session")
def server_config(tiny_cache: Path, tiny_dir: Path) -> EngineConfig:
    return EngineConfig(model="tiny", device="cpu", cache_dir=tiny_cache, max_batch=32, max_queue=32)


ALIGNER = Path(__file__).resolve().parents[1] / "fixtures" / "official" / "qwen3-forced-aligner-tiny-official"


@pytest.fixture(scope="session")
def live(server_config: EngineConfig) -> Iterator[LiveServer]:
    """The shared server; it times words too (the tiny forced aligner), which a request that does not ask never
    touches, so the one server serves the timestamps tests and every other (servers cost seconds to start)."""
    server = start_server(replace(server_config, aligner=str(ALIGNER)))
    yield server
    try:  # after everything the suite did to it, the server is still healthy and holds nothing
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        stats = server.wait_idle()
        assert stats["active_requests"] == stats["slots_in_use"] == 0, stats
    finally:
        server.stop()


@pytest.fixture
def make_server(server_config: EngineConfig) -> Iterator[Callable[..., LiveServer]]:
    """Starts extra servers with config overrides (and an optional API key, `uvicorn_options` arguments, a voice
    library's directory and quota); stops them after the test."""
    started: list[LiveServer] = []

    def make(api_key: str | None = None, wait_ready: bool = True, options: dict[str, Any] | None = None,
             tuning: dict[str, Any] | None = None, data_dir: Path | None = None, quota: Quota | None = None,
             site: SitePolicy | None = None, **overrides: object) -> LiveServer:
        config = replace(server_config, **overrides).tuned(**(tuning or {}))  # type: ignore[arg-type]
        server = start_server(config, api_key, wait_ready, options, data_dir, quota, site)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c

"""Faults over HTTP and WebSocket: only the affected requests fail, visibly; a hung codec makes the engine dead."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from server.audio.transcode import Transcoder
from tests.server.conftest import LiveServer
from tests.server.leaks import wait_no_leaks
from tests.server.test_abort_paths import speech


def sse_lines(url: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url + "/v1/audio/speech", json={**payload, "stream_format": "sse"}, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def ws_response(url: str, text: str) -> dict[str, Any]:
    """response.done of one Realtime response (after an `error` event when it failed)."""
    with connect(url, max_size=None) as conn:
        conn.recv(timeout=30)
        conn.send(json.dumps({"type": "input_text_buffer.append", "text": text}))
        conn.send(json.dumps({"type": "input_text_buffer.commit"}))
        while (event := json.loads(conn.recv(timeout=30)))["type"] != "response.done":
            pass
        return dict(event["response"])


@pytest.fixture
def hang() -> Iterator[threading.Event]:
    release = threading.Event()
    yield release
    release.set()


def test_encoder_failure_fails_only_that_response(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    original = Transcoder.encode

    def encode(self: Transcoder, pcm: Any) -> bytes:
        if self.format.value == "flac":
            raise RuntimeError("injected encoder fault in /secret/path.py")
        return original(self, pcm)

    monkeypatch.setattr(Transcoder, "encode", encode)
    events = sse_lines(live.url, speech(input="Failing encoder.", response_format="flac"))
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "server_error"
    assert "/secret" not in json.dumps(events[-1]) and "Traceback" not in json.dumps(events[-1])
    assert sse_lines(live.url, speech(input="Fine encoder.", response_format="mp3"))[-1]["type"] == "speech.audio.done"
    assert not (counts := wait_no_leaks(live.url)), counts


def test_codec_fault_over_websocket_fails_only_that_response(make_server: Callable[..., LiveServer]) -> None:
    server = make_server()
    assert server.engine.pipeline is not None
    armed = {"on": True}

    def hook(stage: str, jobs: object) -> None:
        if armed["on"]:
            armed["on"] = False
            raise RuntimeError("injected codec fault")

    server.engine.pipeline.decoder.fault_hook = hook
    failed = ws_response(server.ws_url, "The codec fails here.")
    assert failed["status"] == "failed" and failed["status_details"]["error"]["code"] == "output_error"
    assert ws_response(server.ws_url, "And works again.")["status"] == "completed"
    assert not (counts := wait_no_leaks(server.url)), counts


@pytest.mark.parametrize("stage", ["code_predictor"])
def test_code_predictor_fault_over_websocket(make_server: Callable[..., LiveServer], stage: str) -> None:
    server = make_server()
    assert server.engine.worker is not None
    armed = {"on": True}

    def hook(where: str, batch: object) -> None:
        if where == stage and armed["on"]:
            armed["on"] = False
            raise RuntimeError(f"injected {stage} fault")

    server.engine.worker.fault_hook = hook
    failed = ws_response(server.ws_url, "The predictor fails here.")
    assert failed["status"] == "failed" and failed["status_details"]["error"]["code"] == "generation_error"
    assert ws_response(server.ws_url, "And works again.")["status"] == "completed"


@pytest.mark.parametrize("mode", ["async", "sync"])  # sync: the codec hangs the Talker worker itself
def test_hung_codec_marks_the_engine_dead(
    make_server: Callable[..., LiveServer], hang: threading.Event, mode: str,
) -> None:
    server = make_server(tuning={"codec_timeout_s": 1.0}, output_mode=mode)
    assert server.engine.pipeline is not None
    server.engine.pipeline.decoder.fault_hook = lambda stage, jobs: hang.wait(30)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        resp = c.post("/v1/audio/speech", json=speech(input="The codec hangs."))
        assert resp.status_code == 500 and resp.json()["error"]["code"] == "output_error"
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "dead"
        again = c.post("/v1/audio/speech", json=speech(input="Refused."))
        assert again.status_code == 503 and int(again.headers["retry-after"]) >= 1

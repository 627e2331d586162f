"""Security basics: constant-time key comparison, no internals in error bodies, CORS off unless configured, input
text not logged unless asked, body and Realtime limits with clear errors."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from engine.config import EngineConfig
from server import guard
from server.app import create_app
from server.limits import SPEECH_BODY_BYTES
from server.state import state_of
from tests.server.conftest import API_KEY, LiveServer
from tests.server.test_abort_paths import speech


def test_api_key_is_compared_in_constant_time(make_server: Callable[..., LiveServer],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    server = make_server(api_key=API_KEY)
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(guard.hmac, "compare_digest", spy)
    resp = httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 401 and calls == [(b"nope", API_KEY.encode())]


def test_error_bodies_hold_no_internals(make_server: Callable[..., LiveServer]) -> None:
    server = make_server()
    assert server.engine.worker is not None

    def hook(stage: str, batch: object) -> None:
        raise RuntimeError('boom\nTraceback (most recent call last):\n  File "/opt/talkstream/talker/runner.py"')

    server.engine.worker.fault_hook = hook
    for fmt in ("sse", "audio"):  # fails before the first audio: a 500 envelope
        resp = httpx.post(server.url + "/v1/audio/speech", json=speech(input="Fails.", stream_format=fmt))
        assert resp.status_code == 500 and resp.json()["error"]["code"] == "generation_error"
        assert "/opt/" not in resp.text and "Traceback" not in resp.text
    server.engine.worker.fault_hook = None
    plain = httpx.post(server.url + "/v1/audio/speech", content=b"\xff" * 10, headers={"content-type": "text/x"})
    assert plain.status_code == 400 and "site-packages" not in plain.text and "Traceback" not in plain.text


async def test_cors_is_off_unless_configured(server_config: EngineConfig) -> None:
    preflight = {"Origin": "https://example.com", "Access-Control-Request-Method": "POST"}
    for origins, allowed in ((None, False), (["https://example.com"], True)):
        app = create_app(server_config, cors_origins=origins)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            resp = await c.options("/v1/audio/speech", headers=preflight)
        assert ("access-control-allow-origin" in resp.headers) is allowed, resp.headers


def test_input_text_is_logged_only_when_asked(live: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    secret = "My secret sentence number 4711."
    with caplog.at_level(logging.DEBUG):
        assert httpx.post(live.url + "/v1/audio/speech", json=speech(input=secret), timeout=30).status_code == 200
        assert secret not in caplog.text
        state_of(live.app).log_input = True
        try:
            assert httpx.post(live.url + "/v1/audio/speech", json=speech(input=secret), timeout=30).status_code == 200
        finally:
            state_of(live.app).log_input = False
        assert secret in caplog.text


@pytest.mark.parametrize("chunked", [False, True])
def test_body_size_limit(live: LiveServer, chunked: bool) -> None:
    big = json.dumps(speech(input="x" * (SPEECH_BODY_BYTES + 1))).encode()  # room for a ref_audio, and more
    content: Any = iter([big[i:i + 65536] for i in range(0, len(big), 65536)]) if chunked else big
    resp = httpx.post(live.url + "/v1/audio/speech", content=content, headers={"content-type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"


def test_realtime_limits_answer_errors_and_keep_the_session(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None) as conn:
        conn.recv(timeout=30)
        codes = []
        for message in ("z" * 100_000, json.dumps({"type": "input_text_buffer.append", "text": "a" * 4000}),
                        json.dumps({"type": "input_text_buffer.append", "text": "a" * 200})):
            conn.send(message)
        for _ in range(2):
            event = json.loads(conn.recv(timeout=30))
            assert event["type"] == "error"
            codes.append(event["error"]["code"])
        assert codes == ["event_too_large", "input_text_buffer_full"]
        conn.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(conn.recv(timeout=30))["type"] == "session.updated"

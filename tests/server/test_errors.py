"""Every bad-input case answers 400 in OpenAI's envelope (never 422); auth is 401; a full server is 429."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from common.request import EngineState
from tests.server.conftest import API_KEY, LiveServer

GOOD: dict[str, Any] = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}
LONG_TEXT = "This sentence keeps going on and on so that the audio lasts for a good while. " * 12


def with_(**fields: Any) -> dict[str, Any]:
    return {**GOOD, **fields}


def without(name: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != name}


CASES: list[tuple[str, Any, str | None]] = [
    ("missing input", without("input"), "input"),
    ("missing voice", without("voice"), "voice"),
    ("missing model", without("model"), "model"),
    ("empty input", with_(input=""), "input"),
    ("blank input", with_(input="   "), "input"),
    ("over-long input", with_(input="a" * 4097), "input"),
    ("input not a string", with_(input=42), "input"),
    ("unknown voice", with_(voice="nobody"), "voice"),
    ("unknown voice id", with_(voice={"id": "nobody"}), "voice"),
    ("voice wrong type", with_(voice=["alloy"]), "voice"),
    ("empty voice", with_(voice=""), "voice"),
    ("empty voice id", with_(voice={"id": ""}), "voice"),
    ("empty model", with_(model=""), "model"),
    ("unknown format", with_(response_format="ogg"), "response_format"),
    ("unknown stream format", with_(stream_format="ws"), "stream_format"),
    ("speed too low", with_(speed=0.1), "speed"),
    ("speed too high", with_(speed=4.5), "speed"),
    ("speed as string", with_(speed="fast"), "speed"),
    ("temperature too high", with_(temperature=2.5), "temperature"),
    ("temperature negative", with_(temperature=-1), "temperature"),
    ("top_p zero", with_(top_p=0), "top_p"),
    ("top_k negative", with_(top_k=-3), "top_k"),
    ("seed negative", with_(seed=-1), "seed"),
    ("seed as bool", with_(seed=True), "seed"),
    ("sample rate out of range", with_(sample_rate=4000), "sample_rate"),
    ("sample rate not for opus", with_(sample_rate=24000, response_format="opus"), "sample_rate"),
    ("sample rate not for mp3", with_(sample_rate=17000, response_format="mp3"), "sample_rate"),
    ("unknown field", with_(temprature=0.5), "temprature"),
    ("array body", [GOOD], None),
    ("string body", "hello", None),
]


def assert_envelope(resp: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] == param
    return dict(err)


@pytest.mark.parametrize(("name", "payload", "param"), CASES, ids=[c[0] for c in CASES])
def test_bad_request(client: httpx.Client, name: str, payload: Any, param: str | None) -> None:
    err = assert_envelope(client.post("/v1/audio/speech", json=payload), 400, param)
    assert err["type"] == "invalid_request_error"


def test_an_unknown_model_is_404_as_at_openai(client: httpx.Client) -> None:
    err = assert_envelope(client.post("/v1/audio/speech", json=with_(model="tts-9")), 404, "model")
    assert err["code"] == "model_not_found" and "tiny" in err["message"]


SURROGATE = chr(0xD800)  # a lone surrogate: JSON can carry it (as \ud800), but it is no character


@pytest.mark.parametrize("field", ["input", "voice", "voice.id", "model", "language", "instructions"])
def test_a_lone_surrogate_is_a_400_never_a_500(client: httpx.Client, field: str) -> None:
    body = {**GOOD, "voice": {"id": "alloy"}} if field == "voice.id" else dict(GOOD)
    target = body["voice"] if field == "voice.id" else body
    key = "id" if field == "voice.id" else field
    target[key] = f"x{SURROGATE}y"  # type: ignore[index]
    raw = json.dumps(body).encode()  # ASCII JSON, the surrogate as an escape
    resp = client.post("/v1/audio/speech", content=raw, headers={"content-type": "application/json"})
    err = assert_envelope(resp, 400, field.split(".")[0])
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b"[" * 3000 + b"]" * 3000, b'{"model": "tts-1", "speed": ' + b"9" * 5000 + b"}"])
def test_hostile_json_is_a_400(client: httpx.Client, raw: bytes) -> None:
    resp = client.post("/v1/audio/speech", content=raw, headers={"content-type": "application/json"})
    assert_envelope(resp, 400)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"{\"model\": \"tts-1\",}"])
def test_invalid_json(client: httpx.Client, raw: bytes) -> None:
    resp = client.post("/v1/audio/speech", content=raw, headers={"content-type": "application/json"})
    assert assert_envelope(resp, 400)["type"] == "invalid_request_error"


def test_no_engine_work_for_bad_requests(live: LiveServer, client: httpx.Client) -> None:
    steps = len(live.engine.worker.timings.snapshot()) if live.engine.worker else 0
    for _, payload, _ in CASES[:10]:
        client.post("/v1/audio/speech", json=payload)
    assert live.stats()["active_requests"] == 0
    assert (len(live.engine.worker.timings.snapshot()) if live.engine.worker else 0) == steps


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert_envelope(client.get("/v1/nothing"), 404)
    assert_envelope(client.get("/v1/audio/speech"), 405)


def test_api_key(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(api_key=API_KEY)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            err = assert_envelope(c.post("/v1/audio/speech", json=GOOD, headers=headers), 401)
            assert err["type"] == "authentication_error"
        assert_envelope(c.get("/v1/models"), 401)
        assert c.get("/health").status_code == 200
        ok = c.post("/v1/audio/speech", json=with_(response_format="pcm"),
                    headers={"Authorization": f"Bearer {API_KEY}"})
        assert ok.status_code == 200 and ok.content
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


def test_full_server_answers_429_with_retry_after(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(max_batch=1, max_queue=0)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        payload = with_(input=LONG_TEXT, response_format="pcm", temperature=0.0)
        with c.stream("POST", "/v1/audio/speech", json=payload) as long:
            assert long.status_code == 200
            body = long.iter_raw()  # kept referenced: a collected iterator closes the response
            next(body)
            busy = c.post("/v1/audio/speech", json=GOOD)
            err = assert_envelope(busy, 429)
            assert err["type"] == "rate_limit_error"
            assert int(busy.headers["retry-after"]) >= 1
        assert server.wait_idle()["active_requests"] == 0
        assert c.post("/v1/audio/speech", json=with_(response_format="pcm")).status_code == 200


def test_draining_server_answers_503(make_server: Callable[..., LiveServer]) -> None:
    server = make_server()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        server.engine.state = EngineState.DRAINING  # what drain() sets on shutdown
        resp = c.post("/v1/audio/speech", json=GOOD)
        assert_envelope(resp, 503)
        assert int(resp.headers["retry-after"]) >= 1
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        server.engine.state = EngineState.READY


def test_failure_mid_stream_ends_stream_early(make_server: Callable[..., LiveServer]) -> None:
    server = make_server()
    worker = server.engine.worker
    assert worker is not None
    failing: set[str] = set()

    def hook(stage: str, batch: list[Any]) -> None:
        if stage == "step" and any(seq.request_id in failing for seq in batch):
            raise RuntimeError("injected step failure")

    worker.fault_hook = hook
    payload = with_(input=LONG_TEXT, response_format="mp3", stream_format="sse", temperature=0.0)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", "/v1/audio/speech", json=payload) as resp:
            failing.add(resp.headers["x-request-id"])
            lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
        assert '"type":"error"' in lines[-1] and "generation_error" in lines[-1]
        with c.stream("POST", "/v1/audio/speech", json={**payload, "stream_format": "audio"}) as resp:
            failing.add(resp.headers["x-request-id"])
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in resp.iter_raw():
                    pass
        worker.fault_hook = None
        assert server.wait_idle()["active_requests"] == 0
        assert c.get("/health").status_code == 200
        assert c.post("/v1/audio/speech", json=with_(response_format="pcm")).status_code == 200

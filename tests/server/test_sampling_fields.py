"""Sampling controls and language reach the engine from HTTP and from a Realtime session; voice and language errors
name what is available."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from common.request import SpeechRequest
from tests.server.conftest import LiveServer

FIELDS: dict[str, Any] = {"temperature": 0.0, "top_k": 7, "top_p": 0.8, "repetition_penalty": 1.2, "seed": 5}
BODY: dict[str, Any] = {"model": "tts-1", "input": "Hello there.", "voice": "ben", "response_format": "pcm"}


@pytest.fixture
def submitted(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SpeechRequest]]:
    """Every SpeechRequest the server hands the engine during the test."""
    seen: list[SpeechRequest] = []
    engine = live.engine
    real = engine.submit

    def spy(request: SpeechRequest) -> Any:
        seen.append(request)
        return real(request)

    monkeypatch.setattr(engine, "submit", spy)
    yield seen


def assert_fields(request: SpeechRequest, language: str) -> None:
    for name, value in FIELDS.items():
        assert getattr(request, name) == value, name
    assert request.language == language


def test_http_passes_sampling_fields_and_language(client: httpx.Client, submitted: list[SpeechRequest]) -> None:
    resp = client.post("/v1/audio/speech", json={**BODY, **FIELDS, "language": "english"})
    assert resp.status_code == 200 and len(resp.content) > 0
    (request,) = submitted
    assert_fields(request, "english")
    assert request.voice == "ben"


def test_realtime_session_passes_sampling_fields_and_language(
    live: LiveServer, submitted: list[SpeechRequest]
) -> None:
    with connect(live.ws_url, max_size=None, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {**FIELDS, "language": "chinese"}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"
        ws.send(json.dumps({"type": "input_text_buffer.append", "text": "Hello there."}))
        ws.send(json.dumps({"type": "input_text_buffer.commit"}))
        while json.loads(ws.recv(timeout=30))["type"] != "response.done":
            pass
    (request,) = submitted
    assert_fields(request, "chinese")


def test_temperature_zero_is_greedy_for_talker_and_code_predictor(client: httpx.Client) -> None:
    """With temperature 0 the seed cannot matter: the code predictor is greedy too."""
    audio = [
        client.post("/v1/audio/speech", json={**BODY, "temperature": 0.0, "seed": seed}).content for seed in (1, 2)
    ]
    assert audio[0] == audio[1] and len(audio[0]) > 0
    sampled = [client.post("/v1/audio/speech", json={**BODY, "seed": seed}).content for seed in (1, 2)]
    assert sampled[0] != sampled[1]


@pytest.mark.parametrize(
    ("fields", "param", "named"),
    [
        ({"voice": "nobody"}, "voice", ["aria", "ben", "cleo", "dev", "alloy"]),
        ({"language": "klingon"}, "language", ["auto", "english", "chinese"]),
        ({"repetition_penalty": 3.0}, "repetition_penalty", []),
        ({"repetition_penalty": 0.1}, "repetition_penalty", []),
    ],
)
def test_bad_voice_language_or_penalty_is_400_naming_the_choices(
    client: httpx.Client, fields: dict[str, Any], param: str, named: list[str]
) -> None:
    resp = client.post("/v1/audio/speech", json={**BODY, **fields})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    for name in named:
        assert name in error["message"]

"""Bad input, fuzzed: schemathesis against the server's own OpenAPI schema, and hypothesis-generated Realtime
event sequences. Never a 5xx for bad input, never a dropped session for a bad event, never a hang."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from tests.server.conftest import LiveServer


@pytest.fixture(scope="module")
def fuzz_server(server_config: Any) -> Iterator[LiveServer]:
    from dataclasses import replace

    from tests.server.conftest import start_server

    server = start_server(replace(server_config, max_frames=12))  # valid cases stay short
    yield server
    server.stop()


SPEECH = "/v1/audio/speech"


def fuzz(server: LiveServer, mode: schemathesis.GenerationMode, path: str | None = None) -> list[tuple[str, int]]:
    """50 cases of `mode` for every operation of the OpenAPI schema (or `path`'s alone), each checked: never a 5xx,
    errors in OpenAI's envelope. Returns each case's path and status. In positive mode every other speech case gets
    the served model and voice (the schema cannot know the served names)."""
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    if path is not None:
        api = api.include(path=path)
    seen: list[tuple[str, int]] = []

    @given(case=api.as_strategy(mode))
    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: Any) -> None:
        if (mode is schemathesis.GenerationMode.POSITIVE and case.path == SPEECH and isinstance(case.body, dict)
                and sum(p == SPEECH for p, _ in seen) % 2):
            case.body.update(model="tts-1", voice="alloy")
        response = case.call(base_url=server.url, timeout=30)
        seen.append((case.path, response.status_code))
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if response.status_code >= 400 and response.headers.get("content-type") == "application/json":
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]

    check()
    return seen


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode))
def test_openapi_never_5xx(fuzz_server: LiveServer, mode: schemathesis.GenerationMode) -> None:
    """Cases that fit the schema (positive) or break it (negative), for every operation of the OpenAPI schema.
    Which operations a run draws is chance (without the `ci` profile some runs drew no speech case at all), so
    what a route's cases must reach is asserted on that route's own cases (below)."""
    assert len(fuzz(fuzz_server, mode)) >= 40


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode))
def test_speech_cases_never_5xx_and_reach_validation_and_generation(
        fuzz_server: LiveServer, mode: schemathesis.GenerationMode) -> None:
    """50 speech cases: some are refused (400), and in positive mode some are spoken (200). The half with the
    served names is spoken unless a generated field breaks a rule the schema does not state (ref_audio on a model
    that cannot clone, a language it does not know, a sample rate its format lacks, a whole number written 5.0):
    58% of 300 such cases were spoken, so 25 with none spoken is a broken route, not chance."""
    statuses = [status for _, status in fuzz(fuzz_server, mode, SPEECH)]
    assert len(statuses) >= 40 and 400 in statuses
    assert mode is schemathesis.GenerationMode.NEGATIVE or 200 in statuses, statuses


EVENT_TYPES = ["session.update", "input_text_buffer.append", "input_text_buffer.commit", "input_text_buffer.clear",
               "conversation.item.create", "response.create", "response.cancel", "nonsense", ""]
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
events = st.one_of(
    st.builds(lambda t, extra: json.dumps({"type": t, **extra}), st.sampled_from(EVENT_TYPES),
              st.dictionaries(st.sampled_from(["text", "session", "item", "response", "response_id", "event_id"]),
                              json_values, max_size=3)),
    st.builds(json.dumps, json_values),
    st.text(max_size=50),
    st.binary(max_size=50),
    st.sampled_from(["<huge>", "<huge-append>"]),  # expanded when sent (hypothesis would print them)
)
# past the route's 64 Ki characters, under the WebSocket frame limit (past that the server closes with 1009)
HUGE = {"<huge>": "x" * 200_000,
        "<huge-append>": json.dumps({"type": "input_text_buffer.append", "text": "y" * 200_000})}


@given(st.lists(events, min_size=1, max_size=6))
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_realtime_event_sequences_keep_the_session(fuzz_server: LiveServer, sequence: list[str | bytes]) -> None:
    with connect(fuzz_server.ws_url, max_size=None, open_timeout=30) as conn:
        assert json.loads(conn.recv(timeout=30))["type"] == "session.created"
        for message in sequence:
            conn.send(HUGE.get(message, message) if isinstance(message, str) else message)
        conn.send(json.dumps({"type": "session.update", "session": {}, "event_id": "probe"}))
        while (event := json.loads(conn.recv(timeout=30)))["type"] != "session.updated":
            if event["type"] == "error":
                assert event["error"]["type"] == "invalid_request_error", event
            if event["type"] == "response.done":
                assert event["response"]["status"] in ("completed", "cancelled"), event

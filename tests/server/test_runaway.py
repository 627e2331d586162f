"""No runaway audio, as a client sees it: a model that never ends is cut at its text's cap, and the response says
so, in SSE's `speech.audio.done`, in Realtime's `response.done` (OpenAI's reason, ours as `cause`) and in
/metrics. The official CustomVoice fixture never reaches EOS; served with a frame cap far above the text's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from websockets.sync.client import connect

from engine.config import EngineConfig
from tests.conftest import OFFICIAL_TINY
from tests.server.conftest import LiveServer, start_server
from tests.server.realtime_client import assert_sequence, recv, send, until_done

GREEDY = {"voice": "ryan", "temperature": 0.0, "repetition_penalty": 1.0}


@pytest.fixture(scope="module")
def never_ends(server_config: EngineConfig) -> Iterator[LiveServer]:
    server = start_server(replace(server_config, model=str(OFFICIAL_TINY), max_frames=600, max_batch=2))
    yield server
    server.stop()


def cap(server: LiveServer, text: str) -> int:
    """The frames the text allows, as the server's own frontend counts them."""
    from common.request import SpeechRequest

    frontend = server.engine._loaded.frontend  # type: ignore[union-attr]
    caps = frontend.prepare(SpeechRequest(text=text, voice="ryan")).caps
    assert len(caps) == 1 and caps[0] < 600
    return caps[0]


def test_sse_says_the_speech_reached_its_texts_cap(never_ends: LiveServer) -> None:
    body = {"model": "tts-1", "input": "hello world", "response_format": "pcm", "stream_format": "sse", **GREEDY}
    events = []
    with httpx.stream("POST", never_ends.url + "/v1/audio/speech", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["status"] == "incomplete"
    assert done["status_details"] == {"type": "incomplete", "reason": "max_speech_length"}
    assert done["usage"]["output_tokens"] == cap(never_ends, "hello world")
    metrics = httpx.get(never_ends.url + "/metrics", timeout=10).text
    assert 'talkstream_requests_total{outcome="speech_cap",protocol="http"} 1.0' in metrics


def test_realtime_says_max_output_tokens_with_the_cause(never_ends: LiveServer) -> None:
    with connect(never_ends.ws_url, max_size=None, open_timeout=30) as ws:
        assert recv(ws)["type"] == "session.created"
        send(ws, "session.update", session={"voice": "ryan", "temperature": 0.0})
        assert recv(ws)["type"] == "session.updated"
        send(ws, "input_text_buffer.append", text="hello world")
        send(ws, "input_text_buffer.commit")
        events, audio = until_done(ws)  # every event parses as the official SDK's model
    done = assert_sequence(events, "incomplete")
    assert done["status_details"] == {"type": "incomplete", "reason": "max_output_tokens", "cause": "max_speech_length"}
    assert len(audio) == 2 * 1920 * done["usage"]["output_tokens"]

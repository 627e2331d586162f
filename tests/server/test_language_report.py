"""The language a response was spoken in reaches the client: SSE's `speech.audio.done` `language`, Realtime's
`response.done` `metadata.language` (the SDK's own field)."""

from __future__ import annotations

import json

import httpx
from websockets.sync.client import connect

from tests.server.conftest import LiveServer
from tests.server.realtime_client import recv, send, until_done


def test_sse_reports_the_detected_language(live: LiveServer) -> None:
    body = {"model": "tts-1", "voice": "alloy", "input": "今天天气很好，我们去散步吧。", "temperature": 0.0,
            "response_format": "pcm", "stream_format": "sse"}
    with httpx.stream("POST", live.url + "/v1/audio/speech", json=body, timeout=60) as resp:
        done = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")][-1]
    assert done["type"] == "speech.audio.done" and done["language"] == "chinese"


def test_realtime_reports_it_in_the_responses_metadata(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None, open_timeout=30) as ws:
        assert recv(ws)["type"] == "session.created"
        send(ws, "session.update", session={"temperature": 0.0})
        assert recv(ws)["type"] == "session.updated"
        send(ws, "input_text_buffer.append", text="The weather is lovely today, and we are going for a walk.")
        send(ws, "input_text_buffer.commit")
        events, _ = until_done(ws)  # each event parses as the official SDK's model
    assert events[-1]["response"]["metadata"] == {"language": "english"}

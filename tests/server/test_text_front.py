"""What the text front-end did reaches the client: the language a response was spoken in (SSE's `speech.audio.done`
`language`, Realtime's `response.done` `metadata.language`, the SDK's own field) and the text as read out (SSE's
`transcript`, Realtime's transcript); `normalize: false` over HTTP and in a Realtime session."""

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


def sse_done(live: LiveServer, **fields: object) -> dict[str, object]:
    body = {"model": "tts-1", "voice": "alloy", "temperature": 0.0, "response_format": "pcm", "stream_format": "sse",
            **fields}
    with httpx.stream("POST", live.url + "/v1/audio/speech", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        return [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")][-1]  # type: ignore[no-any-return]


def test_numbers_are_read_out_unless_normalize_is_false(live: LiveServer) -> None:
    assert sse_done(live, input="It is 42% off.")["transcript"] == "It is forty-two percent off."
    assert sse_done(live, input="It is 42% off.", normalize=False)["transcript"] == "It is 42% off."
    bad = httpx.post(live.url + "/v1/audio/speech", json={"model": "tts-1", "input": "x", "normalize": "yes"},
                     timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "normalize"


def test_a_realtime_session_reads_numbers_out_unless_told_not_to(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None, open_timeout=30) as ws:
        assert recv(ws)["type"] == "session.created"
        for normalize, transcript in ((None, "It is forty-two percent off."), (False, "It is 42% off.")):
            session = {"temperature": 0.0} if normalize is None else {"temperature": 0.0, "normalize": normalize}
            send(ws, "session.update", session=session)
            assert recv(ws)["type"] == "session.updated"
            send(ws, "input_text_buffer.append", text="It is 42% off.")
            send(ws, "input_text_buffer.commit")
            events, _ = until_done(ws)
            done = [e for e in events if e["type"] == "response.output_audio_transcript.done"]
            assert done[0]["transcript"] == transcript

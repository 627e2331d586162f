"""Pause tags over HTTP: the SSE transcript shows them, the audio holds their silence, and a bad tag is a 400 that
names `input` (no engine work is done for it)."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np

from tests.server.conftest import LiveServer

BODY = {"model": "tts-1", "voice": "alloy", "temperature": 0.0, "response_format": "pcm"}


def test_sse_reports_the_pauses_in_its_transcript_and_the_audio_holds_them(live: LiveServer) -> None:
    body = {**BODY, "input": "Hello there.[pause:1]Nice to meet you.", "stream_format": "sse"}
    with httpx.stream("POST", live.url + "/v1/audio/speech", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["status"] == "completed"
    assert done["transcript"] == "Hello there. [pause:1] Nice to meet you."
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), "<i2")
    zero = np.concatenate([[0], (pcm == 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(zero))
    assert (edges[1::2] - edges[::2]).max() >= 24000  # one second of exact zeros at 24 kHz
    again = httpx.post(live.url + "/v1/audio/speech", json={**BODY, "input": done["transcript"]}, timeout=60)
    assert again.content == pcm.tobytes()  # the transcript, sent as input, is the same speech


def test_a_bad_pause_tag_is_a_400_naming_input(live: LiveServer) -> None:
    for text in ("Wait [pause:30] for it.", "Wait [pause:soon] for it.", "[pause:1]"):
        resp = httpx.post(live.url + "/v1/audio/speech", json={**BODY, "input": text}, timeout=30)
        error = resp.json()["error"]
        assert resp.status_code == 400 and error["param"] == "input" and "pause" in error["message"], text

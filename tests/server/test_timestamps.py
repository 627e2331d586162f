"""Word timestamps over HTTP (`serve --aligner`): `speech.audio.timestamps` events, one per segment once its audio has
been sent, whose times are the aligner's on that segment's served audio; the audio is the same as without them.
Bad asks are 400s naming `timestamps`."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from engine.aligner.aligner import Aligner
from engine.aligner.words import Clip
from server import cli
from tests.engine.aligner.test_aligner import CHECKPOINT
from tests.server.conftest import LiveServer

BODY = {"model": "tts-1", "voice": "alloy", "temperature": 0.0, "response_format": "pcm", "seed": 7,
        "language": "english"}
TEXT = "Hello there, how are you today? [pause:0.5] The quick brown fox jumps over the lazy dog."


def events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        return [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]


def audio_of(evs: list[dict[str, Any]]) -> np.ndarray:
    return np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in evs if e["type"] == "speech.audio.delta"),
                         "<i2")


def test_each_segment_s_words_are_the_aligner_s_on_its_served_audio(live: LiveServer) -> None:
    evs = events(live.url, {**BODY, "input": TEXT, "stream_format": "sse", "timestamps": "word"})
    kinds = [e["type"] for e in evs]
    assert kinds[-1] == "speech.audio.done" and evs[-1]["status"] == "completed"
    stamps = [e for e in evs if e["type"] == "speech.audio.timestamps"]
    assert [s["segment"] for s in stamps] == [0, 1]
    assert [s["text"] for s in stamps] == ["Hello there, how are you today?",
                                           "The quick brown fox jumps over the lazy dog."]
    audio = audio_of(evs)
    reference = Aligner(CHECKPOINT)
    for s in stamps:
        start, end = round(s["start"] * 24000), round(s["end"] * 24000)
        sent = audio_of(evs[: evs.index(s)])
        assert sent.size >= end - 1  # every sample of the segment went out before its words
        [words] = reference.align([Clip(audio[start:end], 24000, s["text"], "english")])
        assert s["words"] == [{"word": w.word, "start": round(w.start + s["start"], 3),
                               "end": round(w.end + s["start"], 3)} for w in words]
    assert stamps[1]["start"] >= stamps[0]["end"] + 0.5  # the pause between them
    plain = httpx.post(live.url + "/v1/audio/speech", json={**BODY, "input": TEXT}, timeout=120)
    assert plain.content == audio.tobytes()  # the same audio without timestamps
    assert kinds.index("speech.audio.delta") < kinds.index("speech.audio.timestamps")


def test_times_follow_the_speed(live: LiveServer) -> None:
    body = {**BODY, "input": "Hello there, how are you today?", "stream_format": "sse", "timestamps": "word"}
    [normal] = [e for e in events(live.url, body) if e["type"] == "speech.audio.timestamps"]
    [fast] = [e for e in events(live.url, {**body, "speed": 2.0}) if e["type"] == "speech.audio.timestamps"]
    assert fast["words"] == [{"word": w["word"], "start": round(w["start"] / 2, 3), "end": round(w["end"] / 2, 3)}
                             for w in normal["words"]]
    assert fast["end"] == round(normal["end"] / 2, 3)


def test_bad_asks_are_400s_naming_timestamps(live: LiveServer) -> None:
    """(A server without an aligner: tests/server/test_web_page.py::test_the_api_key_field_and_created_voices.)"""
    cases = [({"timestamps": "word"}, "stream_format"),  # a plain audio stream has no place for them
             ({"timestamps": "segment", "stream_format": "sse"}, "word")]
    for extra, said in cases:
        resp = httpx.post(live.url + "/v1/audio/speech", json={**BODY, "input": "Hello.", **extra}, timeout=30)
        error = resp.json()["error"]
        assert resp.status_code == 400 and error["param"] == "timestamps" and said in error["message"], error


def test_say_prints_the_words_times(live: LiveServer, tmp_path: Path, tiny_cache: Path,
                                    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    text = "Hello there, how are you today?"
    args = ["say", text, "-o", str(tmp_path / "x.wav"), "--seed", "3", "--timestamps"]
    assert cli.main([*args, "--url", live.url]) == 0
    remote = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[2] for line in remote] == ["Hello", "there", "how", "are", "you", "today"]
    assert all(float(a) <= float(b) for a, b, _ in (line.split("\t") for line in remote))
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    monkeypatch.setenv("TALKSTREAM_TUNING", "warmup=0")
    assert cli.main([*args, "--local", "--device", "cpu", "--aligner", str(CHECKPOINT)]) == 0
    assert capsys.readouterr().out.splitlines() == remote  # the same speech, timed the same


def test_realtime_sends_each_segment_s_words_and_the_sdk_takes_them(live: LiveServer) -> None:
    """Over the official SDK's own Realtime connection: `response.output_audio.timestamps` after the segment's audio
    (the SDK has no model of it and hands it over with its fields as sent), the same words as over SSE."""
    text = "Hello there, how are you today?"
    sse = [e for e in events(live.url, {**BODY, "input": text, "stream_format": "sse", "timestamps": "word"})
           if e["type"] == "speech.audio.timestamps"]
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
    with client.realtime.connect(model="tts-1") as conn:
        conn.session.update(session={"type": "realtime", "timestamps": "word", "temperature": 0.0, "seed": 7,
                                     "language": "english", "voice": "alloy"})  # type: ignore[typeddict-unknown-key]
        seen = []
        for event in conn:
            seen.append(event)
            if event.type == "session.updated":
                conn.send({"type": "input_text_buffer.append", "text": text})  # type: ignore[arg-type,typeddict-item]
                conn.send({"type": "input_text_buffer.commit"})  # type: ignore[arg-type,typeddict-item]
            if event.type == "response.done":
                break
    kinds = [e.type for e in seen]
    stamps = [e for e in seen if e.type == "response.output_audio.timestamps"]
    assert len(stamps) == 1 and kinds.index("response.output_audio.delta") < kinds.index(stamps[0].type)
    assert kinds.index(stamps[0].type) < kinds.index("response.output_audio.done")
    event = stamps[0].to_dict()  # (the SDK builds it as the first model of its union that takes it, all fields kept)
    assert event["words"] == sse[0]["words"] and event["text"] == text and event["segment"] == 0
    assert seen[-1].response.status == "completed"


def test_the_readme_captions_example_works_as_written(live: LiveServer, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    [code] = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "def speech_with_words" in b]
    monkeypatch.setenv("TALKSTREAM_URL", live.url)
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), scope)  # the README's own example, as a user runs it
    words = scope["words"]
    assert [w["word"] for w in words] == ["Hello", "there", "Nice", "to", "meet", "you"]
    vtt, srt = (tmp_path / "speech.vtt").read_text(), (tmp_path / "speech.srt").read_text()
    assert vtt.startswith("WEBVTT\n\n") and vtt.count(" --> ") == len(words) and "\nmeet\n" in vtt
    assert srt.startswith("1\n") and f"\n{len(words)}\n" in srt and "," in srt.split(" --> ")[0]

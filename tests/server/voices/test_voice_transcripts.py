"""A cloned voice's transcript against the prompt's token budget (issue 34, item 3): a transcript that would leave an
input no room is refused where it is given (`transcript` at creation, `ref_text` with `ref_audio`), before any
decoding or cloning work, and no request blames `instructions` it did not send."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from engine.config import EngineConfig
from frontend.tokenizer import load_tokenizer
from tests.conftest import OFFICIAL_BASE
from tests.server.conftest import LiveServer, start_server
from tests.server.voices.test_routes_voices import BASE, REF, clone, consent, created, speak

LONG = ("word " * 1000)[:4095]  # the transcript: far past the 1024 prompt tokens of the default max_len


@pytest.fixture(scope="module")
def base_config(server_config: EngineConfig) -> EngineConfig:
    return replace(server_config, model=str(OFFICIAL_BASE), max_batch=4)  # default max_len, max_frames: 1024 tokens


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def base(base_config: EngineConfig, data_dir: Path) -> Iterator[LiveServer]:
    server = start_server(base_config, data_dir=data_dir)
    yield server
    server.stop()


def transcript_of(tokens: int) -> str:
    """A transcript of exactly `tokens` tokens (as the checkpoint's tokenizer cuts a reference)."""
    tokenizer = load_tokenizer(OFFICIAL_BASE)
    text = "a " * (tokens - 1)  # one token each, and one more at the end
    assert len(tokenizer.reference(text)) == tokens
    return text


def refused(resp: httpx.Response, param: str) -> str:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and "instructions" not in error["message"], error
    return str(error["message"])


def test_a_transcript_too_long_to_ever_speak_is_refused_at_creation(base: LiveServer) -> None:
    cons = consent(base)
    message = refused(clone(base, "long", cons, transcript=LONG), "transcript")
    assert "tokens" in message and "at most" in message
    assert "long" not in [v["name"] for v in created(base)]


def test_a_transcript_that_fits_alone_but_not_beside_its_recording_is_refused(base: LiveServer) -> None:
    """The recording's frames are known once it is cloned: the voice is refused then, and nothing is stored."""
    cons = consent(base)
    first = refused(clone(base, "edge", cons, transcript=LONG), "transcript")
    fits_alone = int(first.split("at most ")[1].split(" ")[0])  # with the shortest recording
    message = refused(clone(base, "edge", cons, transcript=transcript_of(fits_alone - 5)), "transcript")
    assert "beside its recording's" in message
    assert "edge" not in [v["name"] for v in created(base)]
    ok = clone(base, "edge", cons, transcript=transcript_of(fits_alone - 200))
    assert ok.status_code == 200, ok.text


def test_a_one_off_ref_text_too_long_is_refused_before_its_audio_is_decoded(base: LiveServer) -> None:
    ref = base64.b64encode(REF).decode()
    refused(speak(base, model=BASE, ref_audio=ref, ref_text=LONG), "ref_text")
    # not audio at all: the transcript is refused before the upload is even looked at
    refused(speak(base, model=BASE, ref_audio=base64.b64encode(b"not audio").decode(), ref_text=LONG), "ref_text")


def test_a_stored_voice_that_no_longer_fits_blames_the_voice(base: LiveServer, base_config: EngineConfig,
                                                             data_dir: Path) -> None:
    """A voice made under a larger prompt, spoken by a server with a smaller one: the error names the voice (its
    reference takes the room), not the instructions that were never sent."""
    cons = consent(base)
    made = clone(base, "roomy", cons, transcript=transcript_of(600))  # fits 1024 prompt tokens, not 512
    assert made.status_code == 200, made.text
    small = start_server(replace(base_config, max_len=1024), data_dir=data_dir)
    try:
        message = refused(speak(small, model=BASE, voice="roomy"), "voice")
        assert "reference is too long" in message
    finally:
        small.stop()

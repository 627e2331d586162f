"""The voice library end to end: a live server serving the official Base and VoiceDesign fixtures, through the
official `openai` SDK and plain HTTP. Created voices speak as the official package does (the stored clone prompt
round-trips through SQLite exactly), one-off `ref_audio` speaks as the same voice stored, voices survive a restart,
concurrent creations all land, and every bad input is a 4xx in OpenAI's envelope that stores nothing."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from openai import OpenAI
from websockets.sync.client import connect

from engine.config import EngineConfig
from server import cli
from server.audio.input import MAX_BYTES
from server.state import state_of
from server.voices.store import Quota
from tests.conftest import OFFICIAL_BASE, OFFICIAL_VD, VOICE_REF, VOICE_REF_TEXT
from tests.server.conftest import LiveServer, start_server
from tests.server.realtime_client import recv, send, until_done
from tests.server.voices.library_client import (
    BASE,
    DESIGN,
    FRAMES,
    MAX_FRAMES,
    REF,
    TEXT,
    VD,
    _greedy,
    assert_speaks,
    clone,
    consent,
    created,
    design_voice,
    long_wav,
    reference,
    short_wav,
    silent_wav,
    speak,
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def configs(server_config: EngineConfig) -> list[EngineConfig]:
    return [replace(server_config, model=str(m), max_frames=MAX_FRAMES, max_batch=16)
            for m in (OFFICIAL_BASE, OFFICIAL_VD)]


@pytest.fixture(scope="module")
def lib(configs: list[EngineConfig], data_dir: Path) -> Iterator[LiveServer]:
    server = start_server(configs, data_dir=data_dir)  # type: ignore[arg-type]
    yield server
    server.stop()


@pytest.fixture
def sdk(lib: LiveServer) -> OpenAI:
    return OpenAI(base_url=lib.url + "/v1", api_key="unused", max_retries=0)


def test_the_sdk_creates_a_voice_speaks_it_and_deletes_it(lib: LiveServer, sdk: OpenAI) -> None:
    cons = sdk.audio.voice_consents.create(name="Ann's consent", language="en-US", recording=("ref.wav", REF))
    assert cons.id.startswith("cons_") and cons.object == "audio.voice_consent"
    assert sdk.audio.voice_consents.retrieve(cons.id) == cons
    assert sdk.audio.voice_consents.update(cons.id, name="Ann").name == "Ann"
    assert cons.id in [c.id for c in sdk.audio.voice_consents.list(limit=1)]  # auto-paging, one per page
    voice = sdk.audio.voices.create(name="Ann", consent=cons.id, audio_sample=("ref.wav", REF),
                                    extra_body={"transcript": VOICE_REF_TEXT})
    assert voice.id.startswith("voice_") and (voice.object, voice.type, voice.name) == ("audio.voice", "audio_sample",
                                                                                          "Ann")
    with sdk.audio.speech.with_streaming_response.create(model=BASE, voice={"id": voice.id}, input=TEXT,
                                                         response_format="pcm", extra_body=_greedy()) as resp:
        assert_speaks(resp.read(), OFFICIAL_BASE, "icl_w0")  # the stored in-context prompt, exactly
    assert_speaks(speak(lib, model="tts-1", voice="ann").content, OFFICIAL_BASE, "icl_w0")  # by name; the default
    with pytest.raises(openai.ConflictError):
        sdk.audio.voice_consents.delete(cons.id)  # a voice is made under it
    deleted = sdk.audio.voices.delete(voice.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (voice.id, True, "audio.voice.deleted")
    gone = speak(lib, model=BASE, voice={"id": voice.id})
    assert gone.status_code == 400 and "unknown voice" in gone.json()["error"]["message"]
    assert sdk.audio.voice_consents.delete(cons.id).deleted


def test_x_vector_voices_and_one_off_ref_audio_speak_alike(lib: LiveServer) -> None:
    resp = clone(lib, "Xavier", consent(lib))
    assert resp.status_code == 200, resp.text
    assert_speaks(speak(lib, model=BASE, voice="Xavier").content, OFFICIAL_BASE, "xvec_w0")
    b64 = base64.b64encode(REF).decode()
    assert_speaks(speak(lib, model=BASE, ref_audio=b64).content, OFFICIAL_BASE, "xvec_w0")
    data_url = f"data:audio/wav;base64,{b64}"
    assert_speaks(speak(lib, model=BASE, ref_audio=data_url, ref_text=VOICE_REF_TEXT).content, OFFICIAL_BASE,
                  "icl_w0")
    assert "Xavier" in [v["name"] for v in created(lib)]
    got = httpx.get(f"{lib.url}/v1/audio/voices/{resp.json()['id']}", timeout=30).json()
    assert got == {**resp.json(), "model": BASE} and "prompt" not in got


def test_a_designed_voice_is_its_description(lib: LiveServer, sdk: OpenAI) -> None:
    voice = sdk.audio.voices.create(name="Calm", type="prompt", prompt=DESIGN, model=VD)
    assert (voice.type, voice.prompt) == ("prompt", DESIGN)
    assert_speaks(speak(lib, model=VD, voice={"id": voice.id}).content, OFFICIAL_VD, "vd_w0")
    assert speak(lib, model=VD, voice="calm", instructions="Whisper.").status_code == 200  # both, one after the other
    listing = httpx.get(lib.url + "/v1/audio/voices", params={"model": VD}, timeout=30).json()
    assert listing["data"][0] == {"id": "alloy", "name": "alloy", "speaker": None, "alias_of": None}  # built-ins
    assert listing["data"][-1]["id"] == voice.id and listing["data"][-1]["prompt"] == DESIGN
    wrong_model = speak(lib, model=BASE, voice={"id": voice.id})
    assert wrong_model.status_code == 400 and f"made for model '{VD}'" in wrong_model.json()["error"]["message"]


def test_every_bad_input_is_a_4xx_envelope_and_stores_nothing(lib: LiveServer) -> None:
    cons = consent(lib, "bad inputs")
    clone(lib, "Taken", cons).raise_for_status()
    before = {m: created(lib, m) for m in (BASE, VD)}
    store = state_of(lib.app).library
    consents_before = store.consents(limit=100)
    url = lib.url + "/v1/audio"
    cases: list[tuple[str, int, str | None, httpx.Response]] = [
        ("audio_silent", 400, "audio_sample", clone(lib, "S", cons, silent_wav())),
        ("invalid_audio", 400, "audio_sample", clone(lib, "S", cons, b"RIFF" + bytes(2000))),
        ("audio_too_short", 400, "audio_sample", clone(lib, "S", cons, short_wav())),
        ("audio_too_long", 400, "audio_sample", clone(lib, "S", cons, long_wav())),
        ("audio_too_large", 400, "audio_sample", clone(lib, "S", cons, REF + bytes(MAX_BYTES))),
        ("consent_not_found", 400, "consent", clone(lib, "S", "cons_nope")),
        ("voice_name_taken", 409, "name", clone(lib, "taken", cons)),
        ("invalid_value", 400, "name", clone(lib, "voice_1", cons)),
        ("unsupported_model", 400, "model", clone(lib, "S", cons, model=VD)),
        ("unsupported_model", 400, "model", httpx.post(f"{url}/voices", json={
            "type": "prompt", "name": "P", "prompt": DESIGN, "model": BASE}, timeout=30)),
        ("invalid_value", 400, "name", httpx.post(f"{url}/voices", json={
            "type": "prompt", "name": "alloy", "prompt": DESIGN, "model": VD}, timeout=30)),
        ("missing_field", 400, "prompt", httpx.post(f"{url}/voices", json={"type": "prompt", "name": "P",
                                                                         "model": VD}, timeout=30)),
        ("missing_field", 400, "audio_sample", httpx.post(f"{url}/voices", data={"name": "S", "consent": cons},
                                                          timeout=30)),
        ("audio_silent", 400, "recording", httpx.post(f"{url}/voice_consents", data={
            "name": "c", "language": "en"}, files={"recording": ("s.wav", silent_wav())}, timeout=30)),
        ("invalid_value", 400, "language", httpx.post(f"{url}/voice_consents", data={
            "name": "c", "language": "English!"}, files={"recording": ("r.wav", REF)}, timeout=30)),
        ("invalid_value", 400, "voice", speak(lib, model=BASE, voice="Takn")),
        ("unsupported_url", 400, "ref_audio", speak(lib, model=BASE, ref_audio="https://example.com/a.wav")),
        ("unsupported_model", 400, "ref_audio", speak(lib, model=VD, ref_audio=base64.b64encode(REF).decode())),
        ("invalid_value", 400, "ref_text", speak(lib, model=BASE, ref_text="words")),
        ("missing_field", 400, "voice", speak(lib, model=BASE)),
        ("voice_not_found", 404, "voice_id", httpx.get(f"{url}/voices/voice_nope", timeout=30)),
        ("voice_not_found", 404, "voice_id", httpx.delete(f"{url}/voices/voice_nope", timeout=30)),
        ("consent_not_found", 404, "consent_id", httpx.get(f"{url}/voice_consents/cons_nope", timeout=30)),
        ("consent_in_use", 409, "consent_id", httpx.delete(f"{url}/voice_consents/{cons}", timeout=30)),
    ]
    for code, status, param, resp in cases:
        error = resp.json()["error"]
        assert (resp.status_code, error["code"], error["param"]) == (status, code, param), resp.text
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    unknown = cases[15][3].json()["error"]["message"]
    assert "did you mean 'Taken'" in unknown and "GET /v1/audio/voices" in unknown  # a close match, and the list
    assert {m: created(lib, m) for m in (BASE, VD)} == before and store.consents(limit=100) == consents_before


def test_concurrent_creations_all_succeed_and_are_listed(lib: LiveServer) -> None:
    cons = consent(lib, "many")
    results: list[int] = []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        start.wait()
        results.append(clone(lib, f"Many {i}", cons, transcript=VOICE_REF_TEXT).status_code)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [200] * 8
    assert {f"Many {i}" for i in range(8)} <= {v["name"] for v in created(lib)}


def test_voices_survive_a_restart(configs: list[EngineConfig], tmp_path: Path) -> None:
    first = start_server(configs[0], data_dir=tmp_path)
    try:
        voice = clone(first, "Kept", consent(first), transcript=VOICE_REF_TEXT).json()
        before = speak(first, model=BASE, voice="Kept").content
    finally:
        first.stop()
    second = start_server(configs[0], data_dir=tmp_path)
    try:
        assert [v["id"] for v in created(second)] == [voice["id"]]
        assert speak(second, model=BASE, voice={"id": voice["id"]}).content == before
    finally:
        second.stop()


def test_a_realtime_session_speaks_a_created_voice(lib: LiveServer) -> None:
    voice = clone(lib, "Live", consent(lib), transcript=VOICE_REF_TEXT).json()
    with connect(lib.ws_url, max_size=None) as conn:
        assert recv(conn)["type"] == "session.created"
        send(conn, "session.update", session={"type": "realtime", "model": BASE, "language": "English",
                                              "audio": {"output": {"voice": {"id": voice["id"]}}},
                                              "temperature": 0.0, "repetition_penalty": 1.0,
                                              "max_output_tokens": FRAMES})
        assert recv(conn)["session"]["audio"]["output"]["voice"] == voice["id"]
        send(conn, "conversation.item.create", item={"type": "message", "role": "user",
                                                     "content": [{"type": "input_text", "text": TEXT}]})
        send(conn, "response.create", response={"voice": "live"})  # by name, for this response
        _, audio = until_done(conn)
        got = np.frombuffer(audio, "<i2").astype(np.float64) / 32767
        want = reference(OFFICIAL_BASE, "icl_w0")
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-4  # max_output_tokens: the whole of it
        send(conn, "session.update", session={"voice": "nobody"})
        error = next(e for e in iter(lambda: recv(conn), None) if e["type"] == "error")["error"]
        assert error["param"] == "session.voice" and "GET /v1/audio/voices" in error["message"]


def test_the_cli_adds_lists_speaks_and_removes_voices(lib: LiveServer, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--url", lib.url]
    assert cli.main(["voices", "add", "Cli", str(VOICE_REF), "--transcript", VOICE_REF_TEXT, *flags]) == 0
    voice_id = capsys.readouterr().out.split()[0]
    assert voice_id.startswith("voice_")
    assert cli.main(["voices", "design", "Cli calm", DESIGN, "--model", VD, *flags]) == 0
    assert capsys.readouterr().out.split()[1:] == ["Cli", "calm"]
    assert cli.main(["voices", "list", *flags]) == 0
    listing = capsys.readouterr().out
    assert f"{voice_id}  audio_sample  Cli" in listing and "Cli calm" not in listing  # another model's
    out = tmp_path / "cli.wav"
    assert cli.main(["say", TEXT, "-o", str(out), "--voice", "Cli", "--seed", "1", *flags]) == 0
    assert sf.read(out)[0].size > 24000
    assert cli.main(["voices", "rm", "cli", *flags]) == 0 and capsys.readouterr().out.strip() == f"deleted {voice_id}"
    assert cli.main(["voices", "rm", "Cli calm", "--model", VD, *flags]) == 0
    assert cli.main(["voices", "rm", "Cli", *flags]) == 2 and "no created voice named 'Cli'" in capsys.readouterr().err
    assert cli.main(["voices", "add", "Silent", str(VOICE_REF), "--model", VD, *flags]) == 2
    assert "needs a Base checkpoint" in capsys.readouterr().err
    assert all(c.name != "Silent" for c in state_of(lib.app).library.consents(limit=100)[0])  # its consent went too


def test_names_are_trimmed_normalised_and_compared_case_folded(lib: LiveServer) -> None:
    def design(name: str) -> httpx.Response:
        return httpx.post(lib.url + "/v1/audio/voices", json={"type": "prompt", "name": name, "prompt": DESIGN,
                                                              "model": VD}, timeout=30)

    first = design("  Ärger\u200b ")
    assert first.status_code == 200 and first.json()["name"] == "Ärger", first.text  # trimmed, stored so
    for same in ("ärger", "ÄRGER", "A\u0308rger", "Är\u200bger"):  # case, decomposed, a zero-width space inside
        resp = design(same)
        assert (resp.status_code, resp.json().get("error", {}).get("code")) == (409, "voice_name_taken"), same
    assert speak(lib, model=VD, voice="ärger ").status_code == 200  # looked up by the same key
    lookalikes = ["alloy ", "ＡＬＬＯＹ", "\u0430llo\u0443", "al\u200dloy", "\u200balloy", "Ech\u03bf", "ｖｏｉｃｅ_x",
                  "all\u0585y", "aIIoy", "a\u01c0\u01c0oy", "all\u1ecdy", "allo\u00fd", "v\u043eice_abc"]
    controls = ["ab\u0000c", "ab\ncd", "\x1b[31mred", "red\x1b", "a\u2028b", "\U000f0000"]  # at the ends too
    for name in [*lookalikes, *controls, "\u200b\u200c\u2060", "\u3164", " \u00a0\t", "\u0301"]:
        resp = design(name)
        error = resp.json().get("error", {})
        assert (resp.status_code, error.get("code"), error.get("param")) == (400, "invalid_value", "name"), name
    assert "looks like, the built-in voice 'alloy'" in design("\u0430lloy").json()["error"]["message"]
    assert "control characters" in design("ab\u0000c").json()["error"]["message"]
    consent_url = lib.url + "/v1/audio/voice_consents"
    for name in controls:  # a consent's name follows the same rules
        resp = httpx.post(consent_url, data={"name": name, "language": "en-US"}, files={"recording": ("a.wav", REF)},
                          timeout=60)
        assert (resp.status_code, resp.json().get("error", {}).get("param")) == (400, "name"), resp.text
    names = [v["name"] for v in created(lib, VD)]
    assert [n for n in names if "rger" in n.lower() or "ll" in n.lower() or n.lower().startswith("ech")] == ["Ärger"]


def test_a_description_that_leaves_no_room_is_refused_as_the_voice_is_made(lib: LiveServer) -> None:
    def design(name: str, prompt: str) -> httpx.Response:
        return httpx.post(lib.url + "/v1/audio/voices", json={"type": "prompt", "name": name, "prompt": prompt,
                                                              "model": VD}, timeout=30)

    for name, prompt in (("P2000", "a" * 2000), ("P4000", "a" * 4000)):  # the prompt here: max_len less max_frames
        error = design(name, prompt).json()["error"]
        assert (error["param"], error["code"]) == ("prompt", "invalid_value"), error
        assert "prompt is too long for this model" in error["message"] and "at most" in error["message"]
    invisible = design("Pinvisible", "\u200b\u200b").json()["error"]
    assert (invisible["param"], invisible["code"]) == ("prompt", "missing_field")
    names = {v["name"] for v in created(lib, VD)}
    assert not names & {"P2000", "P4000", "Pinvisible"}


def test_a_stored_description_that_leaves_no_room_is_the_voices_error(lib: LiveServer) -> None:
    """A voice stored before the check (or under a larger prompt): speaking it names the voice, not the instructions
    that were never sent; the same in a Realtime response."""
    stored = state_of(lib.app).library.add_voice("Too wordy", VD, prompt="a" * 4000)
    error = speak(lib, model=VD, voice={"id": stored.id}).json()["error"]
    assert error["param"] == "voice" and "the voice's description is too long" in error["message"], error
    with connect(lib.ws_url, max_size=None) as conn:
        assert recv(conn)["type"] == "session.created"
        send(conn, "session.update", session={"type": "realtime", "model": VD,
                                              "audio": {"output": {"voice": {"id": stored.id}}}})
        recv(conn)
        send(conn, "conversation.item.create", item={"type": "message", "role": "user",
                                                     "content": [{"type": "input_text", "text": TEXT}]})
        send(conn, "response.create")
        error = next(e for e in iter(lambda: recv(conn), None) if e["type"] == "error")["error"]
    assert error["param"] == "voice" and "the voice's description is too long" in error["message"], error
    brief = design_voice(lib, "Brief")
    long_asked = speak(lib, model=VD, voice={"id": brief}, instructions="i" * 4000).json()["error"]
    assert long_asked["param"] == "instructions", long_asked  # the request's own words: its fault


def test_a_field_given_twice_is_refused(lib: LiveServer) -> None:
    url = lib.url + "/v1/audio/voice_consents"
    two_files = httpx.post(url, data={"name": "twice", "language": "en-US"},
                           files=[("recording", ("a.wav", REF)), ("recording", ("b.wav", silent_wav()))], timeout=60)
    two_names = httpx.post(url, data={"name": ["one", "two"], "language": "en-US"},
                           files={"recording": ("a.wav", REF)}, timeout=60)
    blank = httpx.post(url, data={"name": "\u200b\u200b", "language": "en-US"}, files={"recording": ("a.wav", REF)},
                       timeout=60)
    for resp, field in ((two_files, "recording"), (two_names, "name"), (blank, "name")):
        assert (resp.status_code, resp.json().get("error", {}).get("param")) == (400, field), resp.text
    assert two_files.json()["error"]["message"] == "recording: given more than once"
    assert all(c.name not in {"twice", "one", "two"} for c in state_of(lib.app).library.consents(limit=100)[0])
    cons = consent(lib, "  spaced\u200b ")
    assert httpx.get(f"{url}/{cons}", timeout=30).json()["name"] == "spaced"


def test_the_quota_is_a_507_and_metrics_show_the_library(configs: list[EngineConfig], tmp_path: Path) -> None:
    server = start_server(configs[1], data_dir=tmp_path, quota=Quota(max_bytes=len(REF) * 3 // 2, max_voices=1))
    try:
        first = consent(server)
        over = httpx.post(server.url + "/v1/audio/voice_consents", data={"name": "second", "language": "en-US"},
                          files={"recording": ("ref.wav", REF)}, timeout=60)
        design = {"type": "prompt", "prompt": DESIGN, "model": VD}
        voice = httpx.post(server.url + "/v1/audio/voices", json={**design, "name": "One"}, timeout=30)
        too_many = httpx.post(server.url + "/v1/audio/voices", json={**design, "name": "Two"}, timeout=30)
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    assert first and voice.status_code == 200, voice.text
    for resp in (over, too_many):
        code = resp.json().get("error", {}).get("code")
        assert (resp.status_code, code) == (507, "storage_quota_exceeded"), resp.text
    assert "--voice-storage-quota" in over.json()["error"]["message"]
    assert "--max-voices" in too_many.json()["error"]["message"]
    gauges = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("talkstream_voice_library"))
    assert float(gauges["talkstream_voice_library_bytes"]) == len(REF) + len(DESIGN.encode())
    assert (gauges["talkstream_voice_library_voices"], gauges["talkstream_voice_library_consents"]) == ("1.0", "1.0")
    assert float(gauges["talkstream_voice_library_quota_bytes"]) == len(REF) * 3 // 2
    assert float(gauges["talkstream_voice_library_max_voices"]) == 1

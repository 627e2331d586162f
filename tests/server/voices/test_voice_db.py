"""The voice library's file under failure, through live servers: a directory that cannot be made reads as an empty
library and refuses writes with 503; a read-only one still lists and speaks its voices and refuses writes with 503
naming it; a full disk is a 507; never a 500. And a database of the first schema is brought up to date on open.

Tests run as root, where permissions stop nothing. A read-only directory is made real by serving from a `talkstream
serve` child without CAP_DAC_OVERRIDE (`setpriv --bounding-set`: root then obeys the mode bits); a full disk by
the child's file size limit (`prlimit --fsize`: its writes past it fail with EFBIG, as on a full disk)."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server.voices.store import NameTakenError, VoiceStore
from tests.conftest import OFFICIAL_VD, VOICE_REF
from tests.server.conftest import LiveServer

VD = OFFICIAL_VD.name
REF = VOICE_REF.read_bytes()
TEXT = "hello world this is a tiny test"


class Child:
    """`talkstream serve` in a child process, started through `prefix` (setpriv, prlimit)."""

    def __init__(self, cache: Path, prefix: list[str], *flags: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cmd = [*prefix, sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--log-level", "error",
               *flags]
        env = {**os.environ, "TALKSTREAM_CACHE_DIR": str(cache)}  # the session's tiny checkpoint, not written again
        self.proc = subprocess.Popen(cmd, cwd=Path(__file__).parents[3], env=env)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("the server did not become ready")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def child(tiny_cache: Path, tiny_dir: Path) -> Iterator[type[Child]]:
    started: list[Child] = []

    def start(prefix: list[str], *flags: str) -> Child:
        started.append(Child(tiny_cache, prefix, *flags))
        return started[-1]

    yield start  # type: ignore[misc]
    for c in started:
        c.stop()


def needs(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"needs {tool} (util-linux)")
    return path


def consent(url: str, name: str = "me") -> httpx.Response:
    return httpx.post(url + "/v1/audio/voice_consents", data={"name": name, "language": "en-US"},
                      files={"recording": ("ref.wav", REF)}, timeout=60)


def design(url: str, name: str) -> httpx.Response:
    return httpx.post(url + "/v1/audio/voices", json={"type": "prompt", "name": name, "model": VD,
                                                      "prompt": "A calm voice."}, timeout=60)


def error(resp: httpx.Response) -> dict[str, str]:
    body: dict[str, dict[str, str]] = resp.json()
    return body["error"]


def test_a_directory_that_cannot_be_made_is_empty_and_refuses_writes(make_server: type[LiveServer],
                                                                    tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"in the way")
    server = make_server(data_dir=blocker / "library")  # type: ignore[call-arg]
    voices = httpx.get(server.url + "/v1/audio/voices", timeout=30)
    assert voices.status_code == 200 and all(v.get("object") != "audio.voice" for v in voices.json()["data"])
    assert httpx.get(server.url + "/v1/audio/voice_consents", timeout=30).json()["data"] == []
    assert httpx.delete(server.url + "/v1/audio/voices/voice_x", timeout=30).status_code == 404
    unknown = httpx.post(server.url + "/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "nobody"},
                         timeout=30)
    assert unknown.status_code == 400 and error(unknown)["code"] == "invalid_value"
    refused = consent(server.url)
    assert (refused.status_code, error(refused)["code"]) == (503, "storage_unavailable"), refused.text
    assert str(blocker) in error(refused)["message"] and "storing the consent" in error(refused)["message"]


@pytest.fixture
def read_only_library(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """A library holding a consent and a designed voice, its directory and file then read-only."""
    library = tmp_path / "library"
    store = VoiceStore(library)
    cons = store.add_consent("me", "en-US", REF, 5.2).id
    voice = store.add_voice("Calm", VD, prompt="A calm, deep male voice, speaking slowly.").id
    store.close()
    (library / "voices.sqlite3").chmod(0o444)
    library.chmod(0o555)
    yield library, cons, voice
    library.chmod(0o755)


def test_a_read_only_library_lists_and_speaks_and_refuses_writes_with_503(
        child: type[Child], read_only_library: tuple[Path, str, str]) -> None:
    library, cons, voice = read_only_library
    prefix = [needs("setpriv"), "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]
    server = child(prefix if os.geteuid() == 0 else [], "--model", str(OFFICIAL_VD), "--data-dir", str(library))
    listed = httpx.get(server.url + "/v1/audio/voices", params={"model": VD}, timeout=30)
    assert listed.status_code == 200 and voice in [v["id"] for v in listed.json()["data"]]
    assert httpx.get(f"{server.url}/v1/audio/voice_consents/{cons}", timeout=30).status_code == 200
    speech = httpx.post(server.url + "/v1/audio/speech", json={"model": VD, "input": TEXT, "voice": "calm",
                                                               "response_format": "pcm", "seed": 1}, timeout=120)
    assert speech.status_code == 200 and len(speech.content) > 0, speech.text
    url = server.url + "/v1/audio"
    writes = [consent(server.url), design(server.url, "Other"), httpx.delete(f"{url}/voices/{voice}", timeout=30),
              httpx.post(f"{url}/voice_consents/{cons}", json={"name": "renamed"}, timeout=30)]
    for resp in writes:
        assert (resp.status_code, error(resp)["code"]) == (503, "storage_unavailable"), resp.text
        assert f"the voice library at {library} is read-only" in error(resp)["message"]
    assert httpx.get(server.url + "/v1/audio/voices", params={"model": VD}, timeout=30).status_code == 200
    assert not list(library.glob("*-shm")) and not list(library.glob("*-wal"))  # nothing was written


def test_a_full_disk_is_a_507_and_reads_go_on(child: type[Child], tmp_path: Path) -> None:
    library = tmp_path / "library"
    limit = 4 * len(REF)  # a few consents' worth: the child's writes past it fail (EFBIG), as on a full disk
    server = child([needs("prlimit"), f"--fsize={limit}", "--"], "--data-dir", str(library))
    statuses = []
    for i in range(8):
        resp = consent(server.url, f"c{i}")
        statuses.append(resp.status_code)
        if resp.status_code != 200:
            break
    assert statuses[0] == 200 and statuses[-1] == 507, statuses
    assert error(resp)["code"] == "storage_full" and str(library) in error(resp)["message"], resp.text
    listed = httpx.get(server.url + "/v1/audio/voice_consents", params={"limit": 100}, timeout=30)
    assert listed.status_code == 200 and len(listed.json()["data"]) == statuses.count(200)
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


OLD_SCHEMA = """
CREATE TABLE consents (id TEXT PRIMARY KEY, name TEXT NOT NULL, language TEXT NOT NULL, created_at INTEGER NOT NULL,
    recording BLOB NOT NULL, sha256 TEXT NOT NULL, seconds REAL NOT NULL);
CREATE TABLE voices (id TEXT PRIMARY KEY, name TEXT NOT NULL COLLATE NOCASE,
    type TEXT NOT NULL CHECK (type IN ('audio_sample', 'prompt')), model TEXT NOT NULL, created_at INTEGER NOT NULL,
    prompt TEXT, transcript TEXT, x_vector BLOB, ref_codes BLOB, ref_frames INTEGER,
    consent_id TEXT REFERENCES consents(id), UNIQUE (model, name));
"""


def test_a_database_of_the_first_schema_is_migrated_on_open(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "voices.sqlite3")
    db.executescript(OLD_SCHEMA)
    for i, name in enumerate(["Ärger", "Ann", "ärger"]):  # the first schema took both spellings
        db.execute("INSERT INTO voices VALUES (?, ?, 'prompt', 'm', 0, 'calm', NULL, NULL, NULL, NULL, NULL)",
                   (f"voice_{i}", name))
    db.commit()
    db.close()
    store = VoiceStore(tmp_path)
    try:
        assert [v.name for v in store.voices("m")] == ["Ärger", "Ann", "ärger"]  # nothing lost
        assert store.voice_named("m", "ÄRGER").id == "voice_0"  # type: ignore[union-attr]  # the oldest keeps it
        assert store.voice("voice_2") is not None  # the other stays reachable by id
        with pytest.raises(NameTakenError):
            store.add_voice("ANN", "m", prompt="other")
        store.add_voice("Bob", "m", prompt="deep")
    finally:
        store.close()
    again = VoiceStore(tmp_path)  # a second open changes nothing
    try:
        assert [v.name for v in again.voices("m")] == ["Ärger", "Ann", "ärger", "Bob"]
        assert again.voice_named("m", "bob") is not None
    finally:
        again.close()

"""A client of the voice library for its end-to-end tests (test_routes_voices.py): the official checkpoints' names
and references, consents, creations, listings, speech, and recordings that are not usable."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf

from tests.conftest import OFFICIAL_BASE, OFFICIAL_VD, VOICE_REF
from tests.server.conftest import LiveServer

BASE, VD = OFFICIAL_BASE.name, OFFICIAL_VD.name
TEXT = "hello world this is a tiny test"  # the official references' w0
DESIGN = "A calm, deep male voice, speaking slowly."
FRAMES = 59  # the official greedy calls stopped at 59 frames, none at EOS
# a generation's frames at most: 8 per text token, so the text is one segment; the greedy audio runs on past the
# references' 59 frames, which are its beginning
MAX_FRAMES = 119
GREEDY = {"temperature": 0.0, "repetition_penalty": 1.0, "language": "English", "response_format": "pcm"}
REF = VOICE_REF.read_bytes()


def reference(model: Path, key: str) -> np.ndarray:
    return np.load(str(model) + ".reference.npz")[key]


def assert_speaks(pcm: bytes, model: Path, key: str) -> None:
    got = np.frombuffer(pcm, "<i2").astype(np.float64) / 32767
    want = reference(model, key)
    assert got.size > want.size and np.abs(got[:want.size] - want).max() < 1e-4, key


def speak(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/speech", json={"input": TEXT, **GREEDY, **body}, timeout=120)


def consent(server: LiveServer, name: str = "me") -> str:
    resp = httpx.post(server.url + "/v1/audio/voice_consents", data={"name": name, "language": "en-US"},
                      files={"recording": ("ref.wav", REF)}, timeout=60)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def clone(server: LiveServer, name: str, cons: str, audio: bytes = REF, **fields: str) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/voices", data={"name": name, "consent": cons, **fields},
                      files={"audio_sample": ("ref.wav", audio)}, timeout=120)


def created(server: LiveServer, model: str = BASE) -> list[dict[str, Any]]:
    listing = httpx.get(server.url + "/v1/audio/voices", params={"model": model}, timeout=30).json()
    return [v for v in listing["data"] if v.get("object") == "audio.voice"]


def _greedy() -> dict[str, Any]:
    return {k: v for k, v in GREEDY.items() if k != "response_format"}


def silent_wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(48000, np.float32), 24000, format="WAV")
    return buf.getvalue()


def short_wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, sf.read(VOICE_REF, dtype="float32")[0][:12000], 24000, format="WAV")
    return buf.getvalue()


def long_wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.tile(sf.read(VOICE_REF, dtype="float32")[0], 7), 24000, format="WAV")  # 36 s
    return buf.getvalue()


def design_voice(server: LiveServer, name: str) -> str:
    resp = httpx.post(server.url + "/v1/audio/voices", json={"type": "prompt", "name": name, "prompt": DESIGN,
                                                              "model": VD}, timeout=30)
    resp.raise_for_status()
    return str(resp.json()["id"])

"""The README's `speed` "0.25 to 4.0 (pitch kept)": a speed changes the tempo, not the pitch. A pure tone through the
response transcoder keeps its frequency; served speech at 0.25× keeps its spectrum where resampling would move it
down two octaves."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from server.audio.encoders import AudioFormat
from server.audio.transcode import Transcoder
from tests.server.conftest import LiveServer
from tests.server.pcm import PCM_RATE

RATE = 24000


def tone(seconds: float, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (np.sin(2 * np.pi * hz * t) * 12000).astype(np.int16)


def spectrum(pcm: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """Frequencies and magnitudes (Hann window)."""
    mags = np.abs(np.fft.rfft(pcm.astype(np.float64) * np.hanning(pcm.size)))
    return np.fft.rfftfreq(pcm.size, 1 / rate), mags


def dominant_hz(pcm: np.ndarray, rate: int = RATE) -> float:
    freqs, mags = spectrum(pcm, rate)
    return float(freqs[int(mags.argmax())])


def centroid_hz(pcm: np.ndarray, rate: int = RATE) -> float:
    """The spectrum's centre of mass: where a broadband signal's energy sits."""
    freqs, mags = spectrum(pcm, rate)
    return float((freqs * mags).sum() / mags.sum())


@pytest.mark.parametrize("speed", [0.25, 4.0])
def test_a_tone_keeps_its_frequency_at_any_speed(speed: float) -> None:
    """220 Hz stays 220 Hz at 0.25× and at 4× (resampling would make it 55 Hz or 880 Hz); only the length changes."""
    x = tone(4.0)
    t = Transcoder(AudioFormat.PCM, RATE, None, speed)
    y = np.frombuffer(b"".join(t.encode(x[i : i + 1920]) for i in range(0, x.size, 1920)) + t.flush(), np.int16)
    t.close()
    assert y.size == pytest.approx(x.size / speed, rel=0.02)
    assert dominant_hz(x) == pytest.approx(220, abs=1)
    assert dominant_hz(y) == pytest.approx(220, rel=0.03)


def test_served_speech_at_a_quarter_speed_is_four_times_longer_at_the_same_pitch(live: LiveServer) -> None:
    body = {"model": "tts-1", "input": "Hello from the streaming speech server, this is a test.", "voice": "alloy",
            "seed": 7, "temperature": 0.0, "response_format": "pcm"}
    pcm = {}
    for speed in (1.0, 0.25):
        resp = httpx.post(live.url + "/v1/audio/speech", json={**body, "speed": speed}, timeout=60)
        assert resp.status_code == 200
        pcm[speed] = np.frombuffer(resp.content, np.int16)
    assert pcm[0.25].size / PCM_RATE == pytest.approx(4 * pcm[1.0].size / PCM_RATE, rel=0.05)
    ratio = centroid_hz(pcm[0.25]) / centroid_hz(pcm[1.0])
    assert 0.8 < ratio < 1.25, ratio  # slowed down by resampling, it would be about 0.25

"""The response transcoder: time stretch that loses no tail, and a sample count of what is sent."""

from __future__ import annotations

import numpy as np
import pytest

from server.audio.encoders import AudioFormat
from server.audio.transcode import Tempo, Transcoder

RATE = 24000


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (np.sin(2 * np.pi * 220 * t) * 12000).astype(np.int16)


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.75, 1.5, 2.0, 4.0])
def test_a_stretched_stream_keeps_its_last_samples_and_its_length(speed: float) -> None:
    x = tone(2.0)
    t = Tempo(speed, RATE)
    y = np.concatenate([t.process(x[i : i + 1920]) for i in range(0, x.size, 1920)] + [t.drain()])
    ideal = round(x.size / speed)
    assert ideal <= y.size <= ideal + round(0.05 * RATE)
    loud = np.flatnonzero(np.abs(y) > 3000)
    assert loud[-1] >= ideal - round(0.02 * RATE / speed)  # the tone reaches (nearly) the stretched end
    assert y.size - max(ideal, loud[-1] + 1) <= round(0.02 * RATE)  # what follows is the tone's fade, not padding


@pytest.mark.parametrize(("fmt", "rate", "speed"), [("pcm", None, 1.0), ("pcm", 16000, 0.5), ("wav", 8000, 2.0)])
def test_samples_count_what_the_client_gets(fmt: str, rate: int | None, speed: float) -> None:
    t = Transcoder(AudioFormat(fmt), RATE, rate, speed)
    x = tone(1.0)
    data = b"".join(t.encode(x[i : i + 4000]) for i in range(0, x.size, 4000)) + t.flush()
    header = 44 if fmt == "wav" else 0
    assert t.samples == (len(data) - header) // 2
    assert t.samples == pytest.approx(x.size / speed * (rate or RATE) / RATE, abs=0.02 * (rate or RATE))
    t.close()


def test_a_stretch_of_nothing_is_nothing() -> None:
    t = Tempo(0.5, RATE)
    assert t.drain().size == 0


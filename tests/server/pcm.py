"""Decoding helpers for the server tests."""

from __future__ import annotations

import io
import struct

import av
import numpy as np

PCM_RATE = 24000


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int, int]:
    """(mono-or-interleaved samples, sample rate, channels) of a whole response body."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2"), PCM_RATE, 1
    if fmt == "wav":
        rate, channels = parse_wav_header(data[:44])
        return np.frombuffer(data[44:], dtype="<i2"), rate, channels
    with av.open(io.BytesIO(data), format={"opus": "ogg", "aac": "aac"}.get(fmt, fmt)) as container:
        stream = container.streams.audio[0]
        chunks = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        return np.concatenate(chunks), stream.codec_context.sample_rate, stream.codec_context.layout.nb_channels


def parse_wav_header(header: bytes) -> tuple[int, int]:
    riff, riff_size, wave, fmt_tag, _, pcm, channels, rate, _, _, bits, data_tag, data_size = struct.unpack(
        "<4sI4s4sIHHIIHH4sI", header
    )
    assert (riff, wave, fmt_tag, data_tag) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert riff_size == data_size == 0xFFFFFFFF
    assert (pcm, bits) == (1, 16)
    return rate, channels


def seconds(data: bytes, fmt: str) -> float:
    samples, rate, channels = decode(data, fmt)
    return samples.size / channels / rate

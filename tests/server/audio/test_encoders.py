from __future__ import annotations

import io
import struct
from concurrent.futures import ThreadPoolExecutor

import av
import numpy as np
import pytest

from server.audio.encoders import (
    CONTENT_TYPES,
    AudioFormat,
    EncoderClosedError,
    make_encoder,
    open_encoder_count,
    wav_stream_header,
)

RATE = 24000
CHUNKS = (1920, 3840, 17, 0, 5000)
CODEC_FORMATS = (AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.AAC, AudioFormat.FLAC)
# Extra decoded duration allowed: mp3/aac carry encoder priming and frame padding that ADTS and a
# tag-less MPEG stream cannot signal; Ogg Opus trims via pre-skip and the end granule; the rest is exact.
EXTRA_S = {AudioFormat.MP3: 0.2, AudioFormat.AAC: 0.2, AudioFormat.OPUS: 0.005}


def sine(seconds: float, rate: int = RATE, freq: float = 440.0) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (np.sin(2 * np.pi * freq * t) * 10000).astype(np.int16)


def chunked(pcm: np.ndarray, sizes: tuple[int, ...] = CHUNKS) -> list[np.ndarray]:
    out, pos, i = [], 0, 0
    while pos < pcm.size:
        n = sizes[i % len(sizes)]
        out.append(pcm[pos : pos + n])
        pos, i = pos + n, i + 1
    return out


def encode_all(
    fmt: AudioFormat, pcm: np.ndarray, output_rate: int | None = None
) -> tuple[list[bytes], bytes]:
    enc = make_encoder(fmt, output_rate=output_rate)
    try:
        parts = [enc.encode(c) for c in chunked(pcm)]
        return parts, enc.flush()
    finally:
        enc.close()


def decode(data: bytes) -> tuple[np.ndarray, int, int]:
    """Decoded mono float signal in [-1, 1], sample rate, channel count."""
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray() for f in container.decode(stream)]
        rate, channels = stream.codec_context.sample_rate, stream.codec_context.channels
    y = np.concatenate(frames, axis=1)[0]
    if y.dtype == np.int16:
        y = y / 32768.0
    return y.astype(np.float64), rate, channels


def tone_purity(y: np.ndarray, rate: int, freq: float = 440.0) -> tuple[float, float]:
    """(amplitude of the `freq` component, share of the signal it explains) over the steady middle."""
    y = y[int(0.15 * rate) : int(1.35 * rate)]
    t = np.arange(y.size) / rate
    a = 2 * np.mean(y * np.sin(2 * np.pi * freq * t))
    b = 2 * np.mean(y * np.cos(2 * np.pi * freq * t))
    amp = float(np.hypot(a, b))
    rms = float(np.sqrt(np.mean(y**2)))
    return amp, amp / (np.sqrt(2) * rms)


def check_roundtrip(fmt: AudioFormat, data: bytes, rate: int) -> None:
    y, got_rate, channels = decode(data)
    assert (got_rate, channels) == (rate, 1)
    duration = y.size / rate
    assert 1.5 - 1 / rate <= duration <= 1.5 + EXTRA_S.get(fmt, 1 / rate), duration
    amp, purity = tone_purity(y, rate)
    assert amp > 0.2  # input amplitude is 10000 / 32768 ≈ 0.305
    assert purity > 0.95


@pytest.mark.parametrize("fmt", [AudioFormat.WAV, *CODEC_FORMATS])
def test_roundtrip(fmt: AudioFormat) -> None:
    parts, tail = encode_all(fmt, sine(1.5))
    check_roundtrip(fmt, b"".join([*parts, tail]), 48000 if fmt is AudioFormat.OPUS else RATE)


@pytest.mark.parametrize(
    ("fmt", "rate"),
    [("wav", 16000), ("flac", 44100), ("mp3", 16000), ("mp3", 48000), ("aac", 22050), ("aac", 8000)],
)
def test_resampled_roundtrip(fmt: str, rate: int) -> None:
    parts, tail = encode_all(AudioFormat(fmt), sine(1.5), output_rate=rate)
    check_roundtrip(AudioFormat(fmt), b"".join([*parts, tail]), rate)


def test_pcm_is_exact_passthrough() -> None:
    pcm = sine(1.5)
    parts, tail = encode_all(AudioFormat.PCM, pcm)
    assert b"".join(parts) == pcm.astype("<i2").tobytes()
    assert tail == b""


@pytest.mark.parametrize("rate", [8000, 22050, 48000])
def test_pcm_resample_is_seamless(rate: int) -> None:
    """Chunked resampling equals resampling the whole signal at once: no state lost at chunk seams."""
    pcm = sine(1.5)
    parts, tail = encode_all(AudioFormat.PCM, pcm, output_rate=rate)
    enc = make_encoder(AudioFormat.PCM, output_rate=rate)
    whole = enc.encode(pcm) + enc.flush()
    enc.close()
    assert b"".join([*parts, tail]) == whole
    y = np.frombuffer(whole, dtype="<i2") / 32768.0
    assert y.size == round(1.5 * rate)
    assert tone_purity(y, rate)[1] > 0.99


def test_wav_header_fields() -> None:
    header = wav_stream_header(22050)
    assert len(header) == 44
    fields = struct.unpack("<4sI4s4sIHHIIHH4sI", header)
    unknown = 0xFFFFFFFF
    assert fields == (b"RIFF", unknown, b"WAVE", b"fmt ", 16, 1, 1, 22050, 44100, 2, 16, b"data", unknown)


def test_wav_header_comes_first_even_for_empty_chunk() -> None:
    enc = make_encoder(AudioFormat.WAV)
    assert enc.encode(np.zeros(0, dtype=np.int16)) == wav_stream_header(RATE)
    assert enc.encode(np.arange(10, dtype=np.int16)) == np.arange(10, dtype="<i2").tobytes()
    enc.close()


def test_wav_flush_without_audio_is_just_the_header() -> None:
    enc = make_encoder(AudioFormat.WAV)
    assert enc.flush() == wav_stream_header(RATE)
    enc.close()


@pytest.mark.parametrize("fmt", CODEC_FORMATS)
def test_bytes_flow_before_flush(fmt: AudioFormat) -> None:
    enc = make_encoder(fmt)
    parts = [enc.encode(c) for c in chunked(sine(3.0), (1920,))]
    tail = enc.flush()
    enc.close()
    streamed = sum(map(len, parts))
    assert any(parts[:3]), "no bytes within the first 240 ms of input"
    assert streamed > 0.8 * (streamed + len(tail))


@pytest.mark.parametrize("fmt", list(AudioFormat))
def test_flush_without_audio(fmt: AudioFormat) -> None:
    enc = make_encoder(fmt)
    enc.flush()
    assert enc.flush() == b""
    enc.close()


def test_open_encoder_count_returns_to_baseline() -> None:
    baseline = open_encoder_count()
    encoders = [make_encoder(fmt) for fmt in AudioFormat]
    assert open_encoder_count() == baseline + len(AudioFormat)
    for enc in encoders:
        enc.encode(sine(0.2))
    for enc in encoders[:3]:
        enc.flush()
        enc.close()
    for enc in encoders[3:]:
        enc.close()  # without flush
        enc.close()  # idempotent
    assert open_encoder_count() == baseline


@pytest.mark.parametrize("fmt", list(AudioFormat))
def test_use_after_close_raises(fmt: AudioFormat) -> None:
    enc = make_encoder(fmt)
    enc.encode(sine(0.1))
    enc.close()
    with pytest.raises(EncoderClosedError, match="after close"):
        enc.encode(sine(0.1))
    with pytest.raises(EncoderClosedError):
        enc.flush()


def test_encode_after_flush_raises() -> None:
    enc = make_encoder(AudioFormat.MP3)
    enc.flush()
    with pytest.raises(EncoderClosedError, match="after flush"):
        enc.encode(sine(0.1))
    enc.close()


def test_rejects_non_int16_input() -> None:
    enc = make_encoder(AudioFormat.PCM)
    with pytest.raises(TypeError, match="int16"):
        enc.encode(np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError, match="mono"):
        enc.encode(np.zeros((2, 10), dtype=np.int16))
    enc.close()


@pytest.mark.parametrize(
    ("fmt", "rate", "message"),
    [
        ("ogg", None, "unsupported audio format"),
        ("opus", 24000, "opus output is always 48000"),
        ("mp3", 9000, "mp3 does not support 9000"),
        ("aac", 47000, "aac does not support"),
        ("pcm", 4000, "8000..48000"),
        ("flac", 96000, "8000..48000"),
    ],
)
def test_invalid_combinations(fmt: str, rate: int | None, message: str) -> None:
    baseline = open_encoder_count()
    with pytest.raises(ValueError, match=message):
        make_encoder(fmt, output_rate=rate)
    assert open_encoder_count() == baseline


def test_content_types_cover_every_format() -> None:
    assert set(CONTENT_TYPES) == set(AudioFormat)
    assert CONTENT_TYPES[AudioFormat.OPUS] == "audio/ogg; codecs=opus"


def test_worker_threads_match_single_thread_output() -> None:
    pcm = sine(1.5)
    fmts = list(CODEC_FORMATS) * 2
    joined = {fmt: b"".join([*p, t]) for fmt, (p, t) in ((f, encode_all(f, pcm)) for f in CODEC_FORMATS)}
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda f: encode_all(f, pcm), fmts))
    for fmt, (parts, tail) in zip(fmts, results, strict=True):
        # Compare decoded audio: Ogg picks a random stream serial per container, so bytes differ.
        np.testing.assert_array_equal(decode(b"".join([*parts, tail]))[0], decode(joined[fmt])[0])

"""Streaming audio format encoders: mono s16 PCM chunks in, response body bytes out.

One stateful encoder per response. `encode` returns whatever bytes are final so far (possibly b""),
`flush` drains the codec and writes the container trailer, `close` releases everything and is
idempotent. Concatenating all returned bytes gives one valid file/stream of the chosen format.

Formats and their output rates:
- pcm: raw s16le; wav: one 44-byte streaming header (sizes 0xFFFFFFFF), then s16le.
- mp3 (MPEG audio, libmp3lame), aac (ADTS), flac: at `output_rate` (default: the input rate).
- opus: Ogg Opus at 48000 Hz, the rate every Opus decoder outputs; `output_rate` may only be 48000.
"""

from __future__ import annotations

import struct
import threading
from enum import StrEnum
from typing import Protocol

import numpy as np

from server.audio.encoders_av import AvEncoderCore, ContainerSpec, PcmResampler


class AudioFormat(StrEnum):
    PCM = "pcm"
    WAV = "wav"
    MP3 = "mp3"
    OPUS = "opus"
    AAC = "aac"
    FLAC = "flac"


CONTENT_TYPES: dict[AudioFormat, str] = {
    AudioFormat.PCM: "audio/pcm",
    AudioFormat.WAV: "audio/wav",
    AudioFormat.MP3: "audio/mpeg",
    AudioFormat.OPUS: "audio/ogg; codecs=opus",
    AudioFormat.AAC: "audio/aac",
    AudioFormat.FLAC: "audio/flac",
}

MIN_OUTPUT_RATE = 8000
MAX_OUTPUT_RATE = 48000
OPUS_RATE = 48000
_MPEG_RATES = frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000})
_RATE_SETS: dict[AudioFormat, frozenset[int]] = {AudioFormat.MP3: _MPEG_RATES, AudioFormat.AAC: _MPEG_RATES}

# Ogg pages are cut every 20 ms (one Opus packet) instead of the muxer's default 1 s, so bytes leave
# with each chunk; the price is ~28 bytes of page header per packet (~11 kbit/s).
_AV_SPECS: dict[AudioFormat, ContainerSpec] = {
    AudioFormat.MP3: ContainerSpec("mp3", ("libmp3lame", "mp3"), 64000, {"id3v2_version": "0"}, ("s16p",)),
    AudioFormat.OPUS: ContainerSpec("ogg", ("libopus",), 32000, {"page_duration": "20000"}, ("s16",)),
    AudioFormat.AAC: ContainerSpec("adts", ("aac",), 64000, {}, ("fltp",)),
    AudioFormat.FLAC: ContainerSpec("flac", ("flac",), None, {"metadata_header_padding": "0"}, ("s16",)),
}


class EncoderClosedError(RuntimeError):
    """Raised by `encode`/`flush` on an encoder that was closed (or `encode` after `flush`)."""


class Encoder(Protocol):
    def encode(self, pcm: np.ndarray) -> bytes: ...
    def flush(self) -> bytes: ...
    def close(self) -> None: ...


class _LiveCount:
    """Thread-safe gauge of encoders created and not yet closed (for /metrics leak checks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def add(self, delta: int) -> None:
        with self._lock:
            self._value += delta

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"OPEN_ENCODERS({self._value})"


OPEN_ENCODERS = _LiveCount()


def open_encoder_count() -> int:
    return int(OPEN_ENCODERS)


def wav_stream_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """44-byte PCM WAV header for a stream of unknown length (RIFF and data sizes 0xFFFFFFFF)."""
    block_align = channels * bits // 8
    unknown = 0xFFFFFFFF
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", unknown, b"WAVE",
        b"fmt ", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, bits,
        b"data", unknown,
    )  # fmt: skip


class _Core(Protocol):
    def encode(self, pcm: np.ndarray) -> bytes: ...
    def flush(self) -> bytes: ...
    def close(self) -> None: ...


class _PcmCore:
    """Raw s16le, resampled with a stateful `PcmResampler` when the rates differ."""

    def __init__(self, input_rate: int, output_rate: int) -> None:
        self._resampler = PcmResampler(input_rate, output_rate) if output_rate != input_rate else None

    def encode(self, pcm: np.ndarray) -> bytes:
        if self._resampler is not None:
            pcm = self._resampler.process(pcm)
        return pcm.astype("<i2", copy=False).tobytes()

    def flush(self) -> bytes:
        if self._resampler is None:
            return b""
        return self._resampler.drain().astype("<i2", copy=False).tobytes()

    def close(self) -> None:
        if self._resampler is not None:
            self._resampler.close()


class _WavCore(_PcmCore):
    def __init__(self, input_rate: int, output_rate: int) -> None:
        super().__init__(input_rate, output_rate)
        self._header: bytes | None = wav_stream_header(output_rate)

    def encode(self, pcm: np.ndarray) -> bytes:
        header, self._header = self._header, None
        return (header or b"") + super().encode(pcm)

    def flush(self) -> bytes:
        header, self._header = self._header, None
        return (header or b"") + super().flush()


class StreamEncoder:
    """Lifecycle around one format core: input checks, closed/flushed state, OPEN_ENCODERS accounting."""

    def __init__(self, fmt: AudioFormat, core: _Core) -> None:
        self.format = fmt
        self._core: _Core | None = core
        self._flushed = False
        OPEN_ENCODERS.add(1)

    def encode(self, pcm: np.ndarray) -> bytes:
        core = self._live_core("encode")
        if self._flushed:
            raise EncoderClosedError(f"{self.format} encoder: encode() after flush()")
        return core.encode(_as_mono_s16(pcm))

    def flush(self) -> bytes:
        core = self._live_core("flush")
        if self._flushed:
            return b""
        self._flushed = True
        return core.flush()

    def close(self) -> None:
        core, self._core = self._core, None
        if core is None:
            return
        try:
            core.close()
        finally:
            OPEN_ENCODERS.add(-1)

    @property
    def closed(self) -> bool:
        return self._core is None

    def _live_core(self, op: str) -> _Core:
        if self._core is None:
            raise EncoderClosedError(f"{self.format} encoder: {op}() after close()")
        return self._core


def _as_mono_s16(pcm: np.ndarray) -> np.ndarray:
    if not isinstance(pcm, np.ndarray) or pcm.dtype != np.int16:
        raise TypeError(f"expected an int16 numpy array, got {getattr(pcm, 'dtype', type(pcm))}")
    if pcm.ndim != 1 and pcm.size != max(pcm.shape, default=0):
        raise ValueError(f"expected mono PCM, got shape {pcm.shape}")
    return np.ascontiguousarray(pcm.reshape(-1))


def resolve_output_rate(fmt: AudioFormat, input_rate: int, output_rate: int | None) -> int:
    """The rate `fmt` will be encoded at; raises ValueError for unsupported format/rate combinations."""
    if fmt is AudioFormat.OPUS:
        if output_rate not in (None, OPUS_RATE):
            raise ValueError(
                f"opus output is always {OPUS_RATE} Hz; sample_rate={output_rate} is not supported"
            )
        return OPUS_RATE
    rate = input_rate if output_rate is None else output_rate
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise ValueError(f"sample rate must be an integer, got {rate!r}")
    if output_rate is not None and not MIN_OUTPUT_RATE <= rate <= MAX_OUTPUT_RATE:
        raise ValueError(f"sample_rate must be within {MIN_OUTPUT_RATE}..{MAX_OUTPUT_RATE} Hz, got {rate}")
    allowed = _RATE_SETS.get(fmt)
    if allowed is not None and rate not in allowed:
        raise ValueError(f"{fmt} does not support {rate} Hz; use one of {sorted(allowed)}")
    return rate


def make_encoder(fmt: AudioFormat | str, input_rate: int = 24000, output_rate: int | None = None) -> Encoder:
    """A fresh streaming encoder for one response. Raises ValueError for unknown formats or rates."""
    try:
        fmt = AudioFormat(fmt)
    except ValueError:
        raise ValueError(
            f"unsupported audio format {fmt!r}; expected one of {[f.value for f in AudioFormat]}"
        ) from None
    if isinstance(input_rate, bool) or not isinstance(input_rate, int) or input_rate <= 0:
        raise ValueError(f"input_rate must be a positive integer, got {input_rate!r}")
    rate = resolve_output_rate(fmt, input_rate, output_rate)
    core: _Core
    if fmt is AudioFormat.PCM:
        core = _PcmCore(input_rate, rate)
    elif fmt is AudioFormat.WAV:
        core = _WavCore(input_rate, rate)
    else:
        core = AvEncoderCore(_AV_SPECS[fmt], input_rate, rate)
    return StreamEncoder(fmt, core)

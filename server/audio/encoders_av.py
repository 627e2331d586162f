"""PyAV side of the streaming encoders: one in-memory output container per response.

The container writes into a write-only, non-seekable sink, so muxers never seek back to patch
headers (no Xing tag for mp3, no sample count or MD5 in the FLAC STREAMINFO); every byte they
write is final and can be sent as soon as it appears.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np
from av.audio.frame import AudioFrame
from av.audio.resampler import AudioResampler
from av.audio.stream import AudioStream
from av.container import OutputContainer


class ByteSink:
    """Write-only file object for `av.open`: no seek/tell, so FFmpeg treats it as a stream."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def take(self) -> bytes:
        """Returns everything written since the last call and forgets it."""
        out = bytes(self._buf)
        self._buf.clear()
        return out


@dataclass(frozen=True)
class ContainerSpec:
    """How one response format maps onto PyAV: container, encoder candidates, options."""

    container: str
    codecs: tuple[str, ...]
    bit_rate: int | None = None
    options: dict[str, str] = field(default_factory=dict)
    preferred_formats: tuple[str, ...] = ("s16",)


def pick_encoder(candidates: tuple[str, ...]) -> str:
    """First candidate FFmpeg can encode with; raises ValueError when none is built in."""
    for name in candidates:
        try:
            av.Codec(name, "w")
        except ValueError:  # UnknownCodecError
            continue
        return name
    raise ValueError(f"none of the encoders {candidates} is available in this PyAV build")


def s16_frame(pcm: np.ndarray, rate: int, pts: int) -> AudioFrame:
    """Mono s16 AudioFrame with pts counted in samples at `rate`."""
    frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    frame.time_base = Fraction(1, rate)
    frame.pts = pts
    return frame


class PcmResampler:
    """Stateful s16 mono rate converter (swresample through `av.AudioResampler`), seamless across chunks."""

    def __init__(self, input_rate: int, output_rate: int) -> None:
        self._input_rate = input_rate
        self._resampler: AudioResampler | None = AudioResampler(format="s16", layout="mono", rate=output_rate)
        self._pts = 0

    def process(self, pcm: np.ndarray) -> np.ndarray:
        if pcm.size == 0 or self._resampler is None:
            return np.zeros(0, dtype=np.int16)
        frame = s16_frame(pcm, self._input_rate, self._pts)
        self._pts += pcm.size
        return _frames_to_pcm(self._resampler.resample(frame))

    def drain(self) -> np.ndarray:
        """Returns the samples still inside the filter; the resampler is finished afterwards."""
        resampler, self._resampler = self._resampler, None
        if resampler is None or self._pts == 0:
            return np.zeros(0, dtype=np.int16)
        return _frames_to_pcm(resampler.resample(None))

    def close(self) -> None:
        self._resampler = None


def _frames_to_pcm(frames: list[AudioFrame]) -> np.ndarray:
    if not frames:
        return np.zeros(0, dtype=np.int16)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16, copy=False)


class AvEncoderCore:
    """s16 chunks → AudioResampler (codec format, rate, frame size) → encoder → muxer → bytes.

    Construction writes the container header into the sink; it comes out with the first `encode`.
    """

    def __init__(self, spec: ContainerSpec, input_rate: int, output_rate: int) -> None:
        self._input_rate = input_rate
        self._sink = ByteSink()
        self._pts = 0
        self._container: OutputContainer | None = av.open(
            self._sink, mode="w", format=spec.container, options=dict(spec.options)
        )
        try:
            self._stream = self._open_stream(self._container, spec, output_rate)
        except BaseException:
            self.close()
            raise
        ctx = self._stream.codec_context
        self._resampler: AudioResampler | None = AudioResampler(
            format=ctx.format, layout="mono", rate=ctx.sample_rate, frame_size=ctx.frame_size or None
        )

    @staticmethod
    def _open_stream(container: OutputContainer, spec: ContainerSpec, rate: int) -> AudioStream:
        stream = container.add_stream(pick_encoder(spec.codecs), rate=rate)
        if not isinstance(stream, AudioStream):
            raise TypeError(f"{spec.codecs} did not give an audio stream")
        stream.layout = "mono"
        supported = [f.name for f in stream.codec_context.codec.audio_formats or ()]
        preferred = [f for f in spec.preferred_formats if f in supported]
        if preferred:
            stream.format = preferred[0]
        if spec.bit_rate:
            stream.bit_rate = spec.bit_rate
        container.start_encoding()
        return stream

    def encode(self, pcm: np.ndarray) -> bytes:
        if pcm.size and self._resampler is not None:
            frame = s16_frame(pcm, self._input_rate, self._pts)
            self._pts += pcm.size
            self._mux_frames(self._resampler.resample(frame))
        return self._sink.take()

    def flush(self) -> bytes:
        """Drains resampler and encoder, writes the trailer and releases the native objects."""
        resampler, self._resampler = self._resampler, None
        if resampler is not None and self._pts:
            self._mux_frames(resampler.resample(None))
        if self._container is not None:
            self._container.mux(self._stream.encode(None))
            container, self._container = self._container, None
            container.close()
        return self._sink.take()

    def _mux_frames(self, frames: list[AudioFrame]) -> None:
        assert self._container is not None
        for frame in frames:
            self._container.mux(self._stream.encode(frame))

    def close(self) -> None:
        """Frees the container without draining; a failing trailer write is ignored, nobody reads it."""
        self._resampler = None
        container, self._container = self._container, None
        if container is not None:
            with contextlib.suppress(av.FFmpegError):
                container.close()

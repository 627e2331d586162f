"""Per-response audio output: optional tempo change (FFmpeg atempo, pitch kept), optional resampling, then one
streaming encoder at the output rate, which therefore sees every sample the response sends (`samples`).

`Transcoder` is stateful and not thread-safe by itself; a lock serialises its calls, so work can run on an
executor while a cancelled handler closes it from the event loop without racing an in-flight encode.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Executor
from fractions import Fraction

import av
import numpy as np
from av.audio.frame import AudioFrame

from server.audio.encoders import AudioFormat, Encoder, make_encoder, resolve_output_rate
from server.audio.encoders_av import PcmResampler

ATEMPO_MIN, ATEMPO_MAX = 0.5, 2.0  # per atempo instance; wider factors chain several
FLUSH_PAD_S = 0.2  # silence pushed through atempo at the end, so its window lets the last real samples out
SILENT = 8  # |sample| at most this (-72 dBFS) is the padding's silence, which atempo does not leave at exactly 0
TAIL_SLACK_S = 0.05  # how far past the ideal length real samples are looked for (atempo overshoots at high speeds)


def atempo_chain(speed: float) -> list[float]:
    """Factors within atempo's range whose product is `speed`."""
    parts: list[float] = []
    while speed < ATEMPO_MIN:
        parts.append(ATEMPO_MIN)
        speed /= ATEMPO_MIN
    while speed > ATEMPO_MAX:
        parts.append(ATEMPO_MAX)
        speed /= ATEMPO_MAX
    return [*parts, speed]


class Tempo:
    """Streaming s16 mono time stretch: abuffer → atempo… → aformat → abuffersink.

    atempo keeps a window of input back; at the end it lets out only part of it (at speed 0.25 about 50 ms of a
    2 s input went missing). `drain` pushes silence through first, then trims the output to the stretched
    length of the input, so the last real samples come out and the length is right."""

    def __init__(self, speed: float, rate: int) -> None:
        self._rate, self._speed = rate, speed
        self._pts = self._out = 0
        graph = av.filter.Graph()
        nodes = [graph.add_abuffer(format="s16", sample_rate=rate, layout="mono", time_base=Fraction(1, rate))]
        nodes += [graph.add("atempo", f"{factor:.6f}") for factor in atempo_chain(speed)]
        nodes.append(graph.add("aformat", f"sample_fmts=s16:channel_layouts=mono:sample_rates={rate}"))
        nodes.append(graph.add("abuffersink"))
        graph.link_nodes(*nodes).configure()
        self._graph: av.filter.Graph | None = graph

    def process(self, pcm: np.ndarray) -> np.ndarray:
        if self._graph is None or pcm.size == 0:
            return np.zeros(0, dtype=np.int16)
        self._push(pcm)
        out = self._pull()
        self._out += out.size
        return out

    def drain(self) -> np.ndarray:
        if self._graph is None or self._pts == 0:
            self._graph = None
            return np.zeros(0, dtype=np.int16)
        ideal = round(self._pts / self._speed) - self._out  # samples still due
        self._push(np.zeros(round(FLUSH_PAD_S * self._rate), dtype=np.int16))
        self._graph.push(None)
        out = self._pull()
        self._graph = None
        # past the ideal length: what atempo still lets out of the real tail (it overshoots by up to a few tens of
        # ms at high speeds), up to the padding's silence
        tail = out[max(0, ideal) : max(0, ideal) + round(TAIL_SLACK_S * self._rate)]
        beyond = np.flatnonzero(np.abs(tail.astype(np.int32)) > SILENT)
        return out[: max(0, ideal) + (int(beyond[-1]) + 1 if beyond.size else 0)]

    def _push(self, pcm: np.ndarray) -> None:
        assert self._graph is not None
        frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.time_base, frame.pts = self._rate, Fraction(1, self._rate), self._pts
        self._pts += pcm.size
        self._graph.push(frame)

    def _pull(self) -> np.ndarray:
        assert self._graph is not None
        chunks = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            chunks.append(frame.to_ndarray().reshape(-1))
        return np.concatenate(chunks).astype(np.int16, copy=False) if chunks else np.zeros(0, dtype=np.int16)

    def close(self) -> None:
        self._graph = None


class Transcoder:
    """PCM chunks in, response bytes out, for one response. `close` is idempotent and safe from any thread."""

    def __init__(self, fmt: AudioFormat, input_rate: int, output_rate: int | None, speed: float) -> None:
        self.format = fmt
        self.samples = 0  # at the output rate, after speed: what the client gets
        self._lock = threading.Lock()
        rate = resolve_output_rate(fmt, input_rate, output_rate)
        self._tempo = Tempo(speed, input_rate) if speed != 1.0 else None
        self._resampler = PcmResampler(input_rate, rate) if rate != input_rate else None
        try:
            self._encoder: Encoder | None = make_encoder(fmt, rate, rate)
        except BaseException:
            self.close()
            raise

    @property
    def offload(self) -> bool:
        """Whether calls cost enough to belong off the event loop (compressed formats, time stretch)."""
        return self._tempo is not None or self.format not in (AudioFormat.PCM, AudioFormat.WAV)

    def encode(self, pcm: np.ndarray) -> bytes:
        with self._lock:
            if self._encoder is None:
                return b""
            if self._tempo is not None:
                pcm = self._tempo.process(pcm)
            if self._resampler is not None and pcm.size:
                pcm = self._resampler.process(pcm)
            return self._encode(pcm)

    def flush(self) -> bytes:
        with self._lock:
            if self._encoder is None:
                return b""
            tail = self._tempo.drain() if self._tempo is not None else np.zeros(0, dtype=np.int16)
            if self._resampler is not None:
                tail = np.concatenate([self._resampler.process(tail), self._resampler.drain()])
            return self._encode(tail) + self._encoder.flush()

    def _encode(self, pcm: np.ndarray) -> bytes:
        assert self._encoder is not None
        self.samples += pcm.size
        return self._encoder.encode(pcm) if pcm.size else b""

    def close(self) -> None:
        with self._lock:
            encoder, self._encoder = getattr(self, "_encoder", None), None
            for part in (getattr(self, "_tempo", None), getattr(self, "_resampler", None)):
                if part is not None:
                    part.close()
            if encoder is not None:
                encoder.close()


class AsyncTranscoder:
    """Runs a `Transcoder` inline (cheap formats) or on an executor, one call at a time, in order."""

    def __init__(self, transcoder: Transcoder, executor: Executor) -> None:
        self._t = transcoder
        self._executor = executor

    async def encode(self, pcm: np.ndarray) -> bytes:
        if not self._t.offload:
            return self._t.encode(pcm)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._t.encode, pcm)

    async def flush(self) -> bytes:
        if not self._t.offload:
            return self._t.flush()
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._t.flush)

    @property
    def samples(self) -> int:
        return self._t.samples

    def close(self) -> None:
        """Never blocks the loop: an in-flight encode finishes first on its thread, then the encoder closes."""
        if self._t.offload:
            try:
                self._executor.submit(self._t.close)
                return
            except RuntimeError:  # the executor is shut down: nothing is in flight any more
                pass
        self._t.close()

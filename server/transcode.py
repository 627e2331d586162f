"""Per-response audio output: optional tempo change (FFmpeg atempo, pitch kept) then one streaming encoder.

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

from output_builder.encoders import AudioFormat, Encoder, make_encoder

ATEMPO_MIN, ATEMPO_MAX = 0.5, 2.0  # per atempo instance; wider factors chain several


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
    """Streaming s16 mono time stretch: abuffer → atempo… → aformat → abuffersink."""

    def __init__(self, speed: float, rate: int) -> None:
        self._rate = rate
        self._pts = 0
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
        frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.time_base, frame.pts = self._rate, Fraction(1, self._rate), self._pts
        self._pts += pcm.size
        self._graph.push(frame)
        return self._pull()

    def drain(self) -> np.ndarray:
        if self._graph is None:
            return np.zeros(0, dtype=np.int16)
        self._graph.push(None)
        out = self._pull()
        self._graph = None
        return out

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
        self._lock = threading.Lock()
        self._tempo = Tempo(speed, input_rate) if speed != 1.0 else None
        try:
            self._encoder: Encoder | None = make_encoder(fmt, input_rate, output_rate)
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
            return self._encoder.encode(pcm) if pcm.size else b""

    def flush(self) -> bytes:
        with self._lock:
            if self._encoder is None:
                return b""
            tail = b""
            if self._tempo is not None:
                rest = self._tempo.drain()
                tail = self._encoder.encode(rest) if rest.size else b""
            return tail + self._encoder.flush()

    def close(self) -> None:
        with self._lock:
            encoder, self._encoder = getattr(self, "_encoder", None), None
            if self._tempo is not None:
                self._tempo.close()
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

    def close(self) -> None:
        """Never blocks the loop: an in-flight encode finishes first on its thread, then the encoder closes."""
        if self._t.offload:
            try:
                self._executor.submit(self._t.close)
                return
            except RuntimeError:  # the executor is shut down: nothing is in flight any more
                pass
        self._t.close()

"""Chunk jobs → 16-bit PCM through a codec backend: the codec process (async mode) or the codec in this process
(sync mode); each request's codec state is kept by the backend under its stream id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from output_builder.assembler import ChunkJob, RequestOutput
from output_builder.codec_process import DecodeRequest, decode_batch
from output_builder.codecs.qwen12hz import Qwen12HzCodec
from output_builder.primed import PrimedStates

FaultHook = Callable[[str, list[ChunkJob]], None]


class DecodeBackend(Protocol):
    def decode(self, jobs: list[tuple[int, np.ndarray]], urgent: bool = False,
               context: dict[int, int] | None = None, peek: set[int] | None = None) -> list[np.ndarray]: ...

    def close_stream(self, sid: int) -> None: ...


class InProcessCodec:
    """The codec in this process (sync mode: used inline by the Talker worker)."""

    def __init__(self, codec: Qwen12HzCodec) -> None:
        self.codec = codec
        self._states: dict[int, object] = {}
        self._closed: list[int] = []
        self._primed = PrimedStates()

    def decode(self, jobs: list[tuple[int, np.ndarray]], urgent: bool = False,
               context: dict[int, int] | None = None, peek: set[int] | None = None) -> list[np.ndarray]:
        closed, self._closed = self._closed, []
        request = DecodeRequest(jobs, closed, context or {}, peek or set())
        return decode_batch(self.codec, self._states, request, None, self._primed)

    def close_stream(self, sid: int) -> None:
        self._closed.append(sid)


class ChunkDecoder:
    """Turns chunk jobs into 16-bit PCM, each request's codec state kept by the backend under its stream id."""

    def __init__(self, backend: DecodeBackend) -> None:
        self.backend = backend
        self.fault_hook: FaultHook | None = None  # test-only fault injection
        self.open_streams: set[int] = set()  # stream ids with codec state (a leak shows here)

    def decode(self, jobs: list[ChunkJob], urgent: bool = False) -> list[np.ndarray | None]:
        if self.fault_hook is not None:
            self.fault_hook("codec", jobs)
        live = [j for j in jobs if j.codes is not None and not j.out.stream.done]
        for j in live:
            self.open_streams.add(j.out.stream_id)
            if j.out.released:  # released on the loop meanwhile
                self.open_streams.discard(j.out.stream_id)
        pairs = [(j.out.stream_id, padded(j.codes, j.size)) for j in live if j.codes is not None]
        context = {j.out.stream_id: j.context for j in live if j.context}
        peek = {j.out.stream_id for j in live if j.peek}
        pcm = self.backend.decode(pairs, urgent, context, peek) if pairs else []
        by_job = {id(j): heard(j, a) for j, a in zip(live, pcm, strict=True)}
        return [by_job.get(id(j)) for j in jobs]

    def release(self, out: RequestOutput) -> None:
        if not out.released:
            out.released = True
            self.open_streams.discard(out.stream_id)
            self.backend.close_stream(out.stream_id)


def padded(codes: np.ndarray, size: int) -> np.ndarray:
    """codes [G, N] -> [G, max(N, size)], the last frame repeated: the codec decodes every chunk at its full size."""
    short = size - codes.shape[1]
    return codes if short <= 0 else np.concatenate([codes, np.repeat(codes[:, -1:], short, axis=1)], axis=1)


def heard(job: ChunkJob, pcm: np.ndarray) -> np.ndarray:
    """The samples of the job's frames the request has not heard: none of the padding, none heard ahead."""
    decoded = max(job.size, job.frames) - job.context  # frames the codec returned samples for
    if decoded <= 0 or (job.ahead == 0 and decoded == job.frames - job.context):
        return pcm
    per_frame = pcm.shape[-1] // decoded
    return pcm[..., job.ahead * per_frame : (job.frames - job.context) * per_frame]

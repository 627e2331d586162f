"""Per-request frame assembly: each step's row of codes → codec chunks (a small first chunk for fast first audio,
then larger ones). Runs wherever snapshots are consumed: the event loop (async mode) or the worker (sync mode)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from common.request import FinishReason
from output_builder.repetition import RepeatWatch
from output_builder.streams import AudioStream
from output_builder.timing import WordTimer

_stream_ids = itertools.count(1)


@dataclass(slots=True, eq=False)
class RequestOutput:
    """The output side of one request: the `sink` its worker Seqs point at.

    A long text is spoken as several segments (one Seq each, one after another, `segment` counting them) into this
    one output, so the codec's streaming state runs on across the joins. `push` takes a row only from the current
    segment: a finished segment's Seq may still be stepped until the worker sees its EOS.
    """

    request_id: str
    stream: AudioStream
    max_frames: int  # the whole response's frames at most (a limit the client set)
    eos_id: int
    first_chunk: int
    chunk: int
    segment_frames: int = 1 << 62  # one segment's frames at most: the server's cap
    caps: tuple[int, ...] = ()  # each segment's frames at most, by its text (within segment_frames; none: that)
    segments_left: int = 0
    on_segment_end: Callable[[RequestOutput], None] | None = None  # starts the next segment
    watch: RepeatWatch | None = None  # ends a segment that loops
    on_cut: Callable[[RequestOutput], None] | None = None  # stops the Seq of a segment cut before its EOS (called
    # before `segment` moves on): the worker's own frame cap knows neither a loop nor a streamed text's cap
    context: np.ndarray | None = None  # [G, F] a cloned voice's reference frames: decoded first, heard never
    pauses: tuple[int, ...] = ()  # samples of silence before each segment, then after the last ([pause:N])
    stream_id: int = field(default_factory=lambda: next(_stream_ids))  # names its codec state
    released: bool = False  # codec state dropped
    frames: int = 0  # frames accepted (EOS and later frames are not counted)
    chunks: int = 0
    segment: int = 0
    cut: FinishReason | None = None  # why a segment ended before its EOS (the first): part of its text is unspoken
    closed: bool = False  # no more frames are accepted
    _in_segment: int = 0
    _pending: list[np.ndarray] = field(default_factory=list)
    _heard_ahead: int = 0  # pending frames already heard through a look-ahead decode
    _silences: list[tuple[int, int]] = field(default_factory=list)  # (pending frames before it, samples) to splice
    _ends: list[int] = field(default_factory=list)  # pending frames before each segment's end
    timer: WordTimer | None = None  # cuts each segment's audio for its word timestamps (those who asked)
    waiting: bool = False  # its last frame used the last of its text so far: no frame comes until more text does

    def push(self, row: np.ndarray, segment: int = 0, held: bool = False) -> ChunkJob | None:
        """row: [G] codes of one frame of `segment`. Returns a chunk when one is ready. `held`: the request's text
        ran out with this frame, so it makes no more frames until more text comes (`waiting`); the output side
        then has the frames of the chunk being filled heard through `look_ahead`."""
        if self.closed or segment != self.segment:
            return None
        self.waiting = held
        code = int(row[0])
        if code == self.eos_id:
            return self._end_segment(None)
        self._pending.append(row)
        self.frames += 1
        self._in_segment += 1
        if self.frames >= self.max_frames:
            return self._close(FinishReason.MAX_FRAMES)
        if self.watch is not None and self.watch.see(code):
            if (job := self._end_segment(FinishReason.REPETITION)) is not None:
                return job
        elif self._in_segment >= (cap := self.segment_cap):
            reason = FinishReason.SPEECH_CAP if cap < self.segment_frames else FinishReason.MAX_FRAMES
            if (job := self._end_segment(reason)) is not None:
                return job
        return self._cut(None) if len(self._pending) >= self._target() else None

    @property
    def segment_cap(self) -> int:
        """The current segment's frames at most."""
        return self.caps[self.segment] if self.segment < len(self.caps) else self.segment_frames

    def _target(self) -> int:
        return chunk_target(self.first_chunk, self.chunk, self.chunks)

    def look_ahead(self) -> ChunkJob | None:
        """While the request waits for text: the pending frames of a chunk not yet full, decoded now on a copy of
        the codec state (`peek`); None when there is nothing new to hear.

        Each chunk is decoded at its full size (`ChunkJob.size`; a short one padded), and every layer of the codec
        is causal, so a frame's samples depend only on the state, the frames up to it and that size: the samples
        heard now are bit for bit those the whole chunk gives later, which then sends only the rest (`ahead`).
        The audio is thus the same however the text's arrival made the request wait."""
        if not self.waiting or self.closed or self.chunks == 0 or len(self._pending) <= self._heard_ahead:
            return None  # (the first chunk opens the codec state)
        codes = np.stack(self._pending, axis=1)  # [G, N]
        job = ChunkJob(self, codes, None, size=self._target(), ahead=self._heard_ahead, peek=True)
        self._heard_ahead = len(self._pending)
        return job

    def _end_segment(self, cut: FinishReason | None) -> ChunkJob | None:
        """The last segment ends the stream; any other hands over to the next, whose frames join the pending.
        `cut`: why the segment ended before its EOS (None: it said it)."""
        self.cut = self.cut or cut
        if cut is not None and self.on_cut is not None:
            self.on_cut(self)
        self._ends.append(len(self._pending))
        self._pause(self.segment + 1)  # the silence after it: before the next segment, or at the end
        if self.segments_left == 0:
            return self._close(self.cut or FinishReason.EOS)
        self.segments_left -= 1
        self.segment += 1
        self._in_segment = 0
        if self.watch is not None:
            self.watch.reset()
        if self.on_segment_end is not None:
            self.on_segment_end(self)
        return None

    def _pause(self, index: int) -> None:
        """Silence goes where the frames pending now end (the codec's state runs on across it, unaware)."""
        if index < len(self.pauses) and self.pauses[index] > 0:
            self._silences.append((len(self._pending), self.pauses[index]))

    def _close(self, reason: FinishReason) -> ChunkJob:
        self.closed = True
        return self._cut(reason)

    def _cut(self, final: FinishReason | None) -> ChunkJob:
        codes = np.stack(self._pending, axis=1) if self._pending else None  # [G, N]
        size, ahead = self._target(), self._heard_ahead
        if self.chunks == 0 and self.pauses and self.pauses[0] > 0:  # the silence before the first segment
            self._silences.insert(0, (0, self.pauses[0]))
        silences, ends = tuple(self._silences), tuple(self._ends)
        self._pending, self._heard_ahead, self._silences, self._ends = [], 0, [], []
        self.chunks += 1
        context = 0
        if self.chunks == 1 and self.context is not None and codes is not None:  # in-context cloning: the codec
            context = self.context.shape[1]  # hears the reference first, as the official decode does
            codes = np.concatenate([self.context.astype(codes.dtype), codes], axis=1)
        return ChunkJob(self, codes, final, first=self.chunks == 1, context=context, size=context + size,
                        ahead=ahead, silences=silences, ends=ends)

    def abandon(self) -> None:
        """Cancelled or failed: accept no more frames."""
        self.closed = True
        self._pending, self._heard_ahead = [], 0


def chunk_target(first: int, largest: int, index: int) -> int:
    """Frames in a request's chunk `index` (0-based): `first`, then doubling up to `largest` (1, 2, 4, 8, 8, ...).

    Doubling keeps each chunk no longer than the audio already sent, so a player's buffer grows from the first
    chunk on instead of draining while the first full-size chunk is generated; it also hands the codec work during
    the steps that would otherwise only fill the first full chunk.
    """
    if index == 0:
        return first
    return min(first << min(index, 16), largest) if first < largest else largest


@dataclass(slots=True)
class ChunkJob:
    """Codes to decode for one request; `final` ends its stream once the audio is delivered.

    The codec decodes `size` frames (`codes` padded with copies of its last frame: only a final chunk, or a look-ahead,
    is short) and the request hears frames `context + ahead` to N of them."""

    out: RequestOutput
    codes: np.ndarray | None  # [G, N], None when a final chunk has no new frames
    final: FinishReason | None
    first: bool = False  # the request's first chunk: nothing of it has been decoded yet
    context: int = 0  # leading frames of `codes` that prime a new codec stream, unheard (output_builder/primed.py)
    size: int = 0  # frames the codec decodes: the chunk's full size (0: N)
    ahead: int = 0  # frames after `context` already heard through a look-ahead
    peek: bool = False  # a look-ahead: decoded on a copy of the codec state, which goes on unchanged
    silences: tuple[tuple[int, int], ...] = ()  # (heard frames before it, samples of silence) spliced into its audio
    ends: tuple[int, ...] = ()  # heard frames before each segment's end in it

    @property
    def frames(self) -> int:
        return 0 if self.codes is None else int(self.codes.shape[1])

    @property
    def heard(self) -> int:
        """Frames of this job the request hears."""
        return max(self.frames - self.context - self.ahead, 0)


"""Each segment's audio, as heard, for its word timestamps: the delivered PCM cut where each segment's frames end.

A response's timeline is its audio and the silences of its pauses, one after another; a segment starts at its first
sample. When a segment ends (its EOS, a cap, or the response's last frame) its samples go to `on_segment` with where
it starts, and the aligner times its words from there. Runs on the event loop, where chunks are delivered."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# (segment index, its samples [S] int16, where it starts: samples from the start of the response's audio)
SegmentSink = Callable[[int, np.ndarray, int], None]


class WordTimer:
    def __init__(self, on_segment: SegmentSink) -> None:
        self.on_segment = on_segment
        self.segment = 0
        self.at = 0  # samples of the response so far, silences included
        self.start: int | None = None  # the current segment's first sample
        self.pieces: list[np.ndarray] = []

    def feed(self, audio: np.ndarray | None, heard: int, ends: tuple[int, ...],
             silences: tuple[tuple[int, int], ...], final: bool) -> None:
        """One delivered chunk: `audio` [S] its heard frames' samples (before its silences are spliced in), `ends`
        and `silences` at frame offsets into it (a segment ends before the silence that follows it)."""
        per_frame = audio.shape[-1] // heard if audio is not None and heard else 0
        marks = sorted([(f, 0, 0) for f in ends] + [(f, 1, n) for f, n in silences])
        done = 0  # frames of `audio` taken
        for frame, kind, samples in marks:
            if audio is not None and frame > done:
                self._take(audio[done * per_frame : frame * per_frame])
                done = frame
            if kind == 0:
                self._end()
            else:
                self.at += samples
        if audio is not None:
            self._take(audio[done * per_frame :])
        if final and self.pieces:  # the response ended inside a segment (a limit): what was heard of it
            self._end()

    def _take(self, pcm: np.ndarray) -> None:
        if pcm.size:
            if self.start is None:
                self.start = self.at
            self.pieces.append(pcm)
            self.at += pcm.size

    def _end(self) -> None:
        if self.pieces and self.start is not None:
            self.on_segment(self.segment, np.concatenate(self.pieces), self.start)
        self.segment += 1
        self.pieces, self.start = [], None

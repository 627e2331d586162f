"""No runaway audio, second guard: a Talker caught in a loop repeats the same few frames' first codes over and over
and never says its end of speech. `RepeatWatch` sees each frame's codebook-0 code and says when the last
LOOP_S seconds repeat with a period of at most MAX_PERIOD frames (at least three times over). Speech does not:
even a held vowel or a pause varies its codes within a second or two, so a normal reading is never cut.
"""

from __future__ import annotations

from collections import deque

LOOP_S = 5.0  # seconds of exact repetition that end a segment
MAX_PERIOD = 16  # frames (1.3 s at 12.5 Hz): a loop of a word or two
MIN_REPEATS = 3


class RepeatWatch:
    """O(MAX_PERIOD) a frame: for each period p, the run of frames whose code equals the one p frames before."""

    __slots__ = ("_history", "_needed", "_runs")

    def __init__(self, frame_rate: float) -> None:
        loop = round(LOOP_S * frame_rate)
        self._history: deque[int] = deque(maxlen=MAX_PERIOD)  # the last codes, newest last
        self._runs = [0] * (MAX_PERIOD + 1)  # _runs[p]: consecutive frames equal to the frame p before
        # a p-periodic stretch of n frames has n - p equalities
        self._needed = [0] + [max(loop, MIN_REPEATS * p) - p for p in range(1, MAX_PERIOD + 1)]

    def see(self, code: int) -> bool:
        """The next frame's codebook-0 code; True when it completes a loop."""
        history, runs, needed = self._history, self._runs, self._needed
        looped = False
        for p in range(1, len(history) + 1):
            runs[p] = runs[p] + 1 if history[-p] == code else 0
            looped |= runs[p] >= needed[p]
        history.append(code)
        return looped

    def reset(self) -> None:
        """A new segment: its frames start afresh."""
        self._history.clear()
        self._runs = [0] * (MAX_PERIOD + 1)

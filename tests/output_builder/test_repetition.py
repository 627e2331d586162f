"""The loop guard: a segment whose codebook-0 codes repeat with a short period for LOOP_S seconds ends there, with
`repetition`; varied codes, a loop shorter than that, and a loop broken by one different code never end it."""

from __future__ import annotations

import numpy as np
import pytest

from common.request import FinishReason
from output_builder.assembler import RequestOutput
from output_builder.repetition import LOOP_S, MAX_PERIOD, MIN_REPEATS, RepeatWatch
from output_builder.streams import AudioStream

RATE = 12.5
LOOP = round(LOOP_S * RATE)  # frames


def first_loop(codes: list[int]) -> int | None:
    """The index of the frame at which the watch says `codes` looped (None: never)."""
    watch = RepeatWatch(RATE)
    return next((i for i, code in enumerate(codes) if watch.see(code)), None)


@pytest.mark.parametrize("period", [1, 2, 5, MAX_PERIOD])
def test_a_short_period_repeated_for_loop_s_ends_at_its_last_frame(period: int) -> None:
    rng = np.random.default_rng(period)
    speech = rng.integers(0, 2048, 40).tolist()  # varied codes first: the loop starts after them
    cycle = rng.choice(2048, period, replace=False).tolist()
    span = max(LOOP, MIN_REPEATS * period)
    codes = speech + (cycle * (span // period + 2))[: span + 10]
    assert first_loop(codes) == len(speech) + span - 1


def test_varied_codes_and_long_periods_never_end() -> None:
    rng = np.random.default_rng(0)
    assert first_loop(rng.integers(0, 2048, 2000).tolist()) is None
    cycle = rng.choice(2048, MAX_PERIOD + 1, replace=False).tolist()  # a period longer than a word or two
    assert first_loop(cycle * 20) is None


def test_a_loop_broken_before_loop_s_starts_counting_again() -> None:
    almost = [7] * (LOOP - 1)
    assert first_loop([*almost, 8, *almost]) is None
    assert first_loop([*almost, 8, *almost, 7, 7]) == len(almost) + LOOP  # 8, then LOOP frames of 7


def test_the_assembler_ends_a_looping_segment_tells_the_worker_and_goes_on_with_the_next() -> None:
    stream = AudioStream("r", 24000, 8.0, lambda rid: None, lambda rid, paused: None)
    cut, started = [], []
    out = RequestOutput("r", stream, 10_000, 99, 1, 8, segments_left=1, watch=RepeatWatch(RATE),
                        on_cut=lambda o: cut.append(o.segment), on_segment_end=lambda o: started.append(o.segment))
    for _ in range(LOOP):
        out.push(np.full(4, 5, dtype=np.int64), segment=0)
    assert cut == [0] and started == [1] and out.cut is FinishReason.REPETITION and out.frames == LOOP
    # the next segment's watch starts afresh: its first LOOP - 1 frames of the same code do not end it
    jobs = [out.push(np.full(4, 5, dtype=np.int64), segment=1) for _ in range(LOOP - 1)]
    assert not out.closed and all(j is None or j.final is None for j in jobs)
    last = out.push(np.full(4, 5, dtype=np.int64), segment=1)
    assert last is not None and last.final is FinishReason.REPETITION and cut == [0, 1]


def test_a_segment_at_its_texts_cap_ends_with_speech_cap_below_the_servers() -> None:
    stream = AudioStream("r", 24000, 8.0, lambda rid: None, lambda rid, paused: None)
    out = RequestOutput("r", stream, 10_000, 99, 1, 8, segment_frames=50, caps=(20,))
    jobs = [out.push(np.full(4, i, dtype=np.int64)) for i in range(20)]
    assert jobs[-1] is not None and jobs[-1].final is FinishReason.SPEECH_CAP
    at_server = RequestOutput("r", stream, 10_000, 99, 1, 8, segment_frames=50, caps=(50,))
    jobs = [at_server.push(np.full(4, i, dtype=np.int64)) for i in range(50)]
    assert jobs[-1] is not None and jobs[-1].final is FinishReason.MAX_FRAMES

"""Frame assembly: chunk sizes double from the first chunk to the largest; EOS and max frames end a request."""

from __future__ import annotations

import numpy as np
import pytest

from common.request import FinishReason
from output_builder.assembler import ChunkJob, RequestOutput, chunk_target
from output_builder.streams import AudioStream

EOS = 99


@pytest.mark.parametrize(("first", "largest", "want"), [
    (1, 8, [1, 2, 4, 8, 8, 8]),
    (2, 8, [2, 4, 8, 8, 8, 8]),
    (3, 8, [3, 6, 8, 8, 8, 8]),
    (8, 8, [8, 8, 8, 8, 8, 8]),
    (12, 8, [12, 8, 8, 8, 8, 8]),
])
def test_chunk_sizes_double_up_to_the_largest(first: int, largest: int, want: list[int]) -> None:
    assert [chunk_target(first, largest, i) for i in range(6)] == want
    assert chunk_target(1, 8, 10_000) == 8


def output(max_frames: int = 100) -> RequestOutput:
    stream = AudioStream("r", 24000, 8.0, lambda rid: None, lambda rid, paused: None)
    return RequestOutput("r", stream, max_frames, EOS, 1, 8)


def frame(i: int) -> np.ndarray:
    return np.full(4, i % EOS, dtype=np.int64)


def test_push_cuts_doubling_chunks_then_the_rest_at_eos() -> None:
    out = output()
    sizes = []
    for i in range(20):
        job = out.push(frame(i))
        if job is not None:
            assert job.codes is not None and job.final is None
            sizes.append(job.codes.shape[1])
    assert sizes == [1, 2, 4, 8]  # 15 frames in chunks, 5 pending
    last = out.push(np.full(4, EOS))
    assert last is not None and last.final is FinishReason.EOS
    assert last.codes is not None and last.codes.shape == (4, 5)
    assert out.frames == 20 and out.push(frame(0)) is None  # closed


def test_max_frames_closes_with_the_pending_frames() -> None:
    out = output(max_frames=5)
    jobs = [out.push(frame(i)) for i in range(5)]
    sizes = [j.codes.shape[1] for j in jobs if j is not None and j.codes is not None]
    assert sizes == [1, 2, 2]
    final = jobs[-1]
    assert final is not None and final.final is FinishReason.MAX_FRAMES


def held(out: RequestOutput, i: int) -> ChunkJob | None:
    """Frame i, with which the text runs out: its chunk if it fills one, else the look-ahead."""
    job = out.push(frame(i), held=True)
    assert out.waiting
    return job if job is not None else out.look_ahead()


def test_a_waiting_request_hears_its_chunks_pending_frames_ahead() -> None:
    """The text ran out with this frame: the frames of the chunk being filled are decoded ahead, at the chunk's
    full size on a copy of the codec state (peek); the whole chunk later sends only the frames after them (ahead)."""
    out = output()
    for i in range(3):  # the chunks of 1 and 2 frames
        assert (out.push(frame(i)) is None) == (i == 1)
    assert out.look_ahead() is None  # not waiting
    ahead = held(out, 3)  # the first frame of the 4-frame chunk
    assert ahead is not None and ahead.peek and ahead.final is None
    assert ahead.codes is not None and ahead.codes.shape == (4, 1)
    assert (ahead.size, ahead.ahead, ahead.heard) == (4, 0, 1)
    assert out.look_ahead() is None  # nothing new to hear
    assert out.push(frame(4)) is None and not out.waiting and out.look_ahead() is None  # more text came
    again = held(out, 5)
    assert again is not None and again.peek and again.codes is not None and again.codes.shape == (4, 3)
    assert (again.ahead, again.heard) == (1, 2)
    whole = held(out, 6)  # fills the chunk: a plain cut that sends the frame not heard yet
    assert whole is not None and not whole.peek and whole.codes is not None and whole.codes.shape == (4, 4)
    assert (whole.size, whole.ahead, whole.heard) == (4, 3, 1)
    peek = held(out, 7)  # the 8-frame chunk
    assert peek is not None and (peek.size, peek.heard) == (8, 1)
    last = out.push(np.full(4, EOS))
    assert last is not None and last.final is FinishReason.EOS and (last.size, last.ahead, last.heard) == (8, 1, 0)
    assert not last.peek and out.look_ahead() is None


def test_no_look_ahead_before_the_first_chunk_opens_the_codec_state() -> None:
    stream = AudioStream("r", 24000, 8.0, lambda rid: None, lambda rid, paused: None)
    out = RequestOutput("r", stream, 100, EOS, 2, 8)  # a first chunk of 2 frames
    assert held(out, 0) is None
    job = held(out, 1)
    assert job is not None and job.first and not job.peek
    assert held(out, 2) is not None  # later chunks look ahead

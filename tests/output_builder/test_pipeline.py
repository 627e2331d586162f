"""The output pipeline's look-ahead timing: a request waiting for text has its pending frames decoded ahead once
its client is about to run out of audio, not while it has audio to spare."""

from __future__ import annotations

import numpy as np

from output_builder.assembler import RequestOutput
from output_builder.chunk_decoder import ChunkDecoder
from output_builder.pipeline import OutputPipeline
from output_builder.streams import AudioStream

EOS = 99
LEAD_S = 0.25


def waiting_output(pipe: OutputPipeline) -> RequestOutput:
    stream = AudioStream("r", 24000, 8.0, lambda rid: None, lambda rid, paused: None)
    out = RequestOutput("r", stream, 100, EOS, 1, 8)
    for i in range(4):  # chunks of 1 and 2 frames, then one frame of the 4-frame chunk, with which the text ran out
        out.push(np.full(4, i), held=i == 3)
    pipe.waiting[out.stream_id] = out
    return out


def pipeline() -> OutputPipeline:
    """One that decodes nothing and routes no rows (these tests hand it their output)."""
    return OutputPipeline(ChunkDecoder(None), lambda exc: None, lambda rid, key: None)  # type: ignore[arg-type]


def test_a_look_ahead_is_due_when_the_client_is_about_to_run_out() -> None:
    pipe = pipeline()
    out = waiting_output(pipe)
    out.stream.plays_until = 101.0  # a client playing since its first audio runs out then
    jobs, later = pipe.look_aheads(100.5, LEAD_S)  # 0.5 s left to play: not yet, in 0.25 s
    assert jobs == [] and later is not None and abs(later - 0.25) < 1e-9 and out.stream_id in pipe.waiting
    jobs, later = pipe.look_aheads(100.75, LEAD_S)
    assert [j.heard for j in jobs] == [1] and jobs[0].peek and later is None and not pipe.waiting


def test_no_look_ahead_once_the_text_came_back() -> None:
    pipe = pipeline()
    out = waiting_output(pipe)
    out.push(np.full(4, 4))  # the next frame: its text came
    assert pipe.look_aheads(0.0, LEAD_S) == ([], None) and not pipe.waiting


def test_a_client_that_ran_out_gets_its_frames_with_their_chunk() -> None:
    """Its text comes slower than speech: it waits for the text anyway, and a look-ahead would cost the codec a
    whole chunk for it."""
    pipe = pipeline()
    out = waiting_output(pipe)
    out.stream.plays_until = 100.0
    assert pipe.look_aheads(100.1, LEAD_S) == ([], None) and not pipe.waiting
    assert out.look_ahead() is not None  # the frames were there to hear


def test_every_delivery_extends_the_play_of_a_client_that_plays_what_it_has() -> None:
    stream = AudioStream("r", 24000, 8.0, lambda rid: None, lambda rid, paused: None)
    stream.put(np.zeros(24000, np.int16))  # 1 s, at once
    first = stream.plays_until
    assert first - 1.0 == stream.first_audio_at
    stream.put(np.zeros(12000, np.int16))  # while it plays: queued after it
    assert stream.plays_until == first + 0.5

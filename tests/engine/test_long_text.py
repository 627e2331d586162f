"""A text whose speech cannot fit one generation is spoken in full: in segments, one after another, into one stream
whose codec state runs on across the joins. And user text is only ever text.

The tiny model reads its text one token per frame and ends its audio (EOS) soon after the text runs out, so how
many frames a response has tells whether all of its text was spoken."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from collections.abc import AsyncIterator

import numpy as np
import pytest
import torch

from common.request import FinishReason, SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine
from output_builder.codecs.qwen12hz import Qwen12HzCodec
from output_builder.streams import AudioStream
from talker.snapshot import StepSnapshot
from tests.engine.conftest import output

SEGMENT_FRAMES = 48  # the server's frame cap per generation: segments of 48 // 8 = 6 text tokens
SENTENCES = ("The quick brown fox jumps over the lazy dog. Then it runs to the water, and it looks at the day. "
             "We can talk about the sound of the voice; it is a tiny test of a long stream.")


@pytest.fixture
async def engine(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    e = Engine(dataclasses.replace(engine_config, max_frames=SEGMENT_FRAMES))
    await e.start()
    yield e
    await e.stop()


class CodeTap:
    """Every routed row, per request id and segment (the engine's output pipeline calls it once per step)."""

    def __init__(self, engine: Engine) -> None:
        self.rows: defaultdict[tuple[str, int], list[np.ndarray]] = defaultdict(list)
        assert engine.pipeline is not None
        engine.pipeline.tap = self

    def __call__(self, snap: StepSnapshot, codes: np.ndarray) -> None:
        for row, (rid, _, segment) in enumerate(snap.rows):
            self.rows[(rid, segment)].append(codes[row].copy())

    def spoken(self, rid: str, segment: int, eos: int) -> np.ndarray:
        """The frames of one segment up to its EOS: [T, G]."""
        rows = np.stack(self.rows[(rid, segment)])
        ends = np.flatnonzero(rows[:, 0] == eos)
        return rows[: ends[0]] if ends.size else rows


async def collect(stream: AudioStream) -> np.ndarray:
    return np.concatenate([c async for c in stream])


def greedy(text: str, rid: str, **kw: object) -> SpeechRequest:
    return SpeechRequest(text=text, voice="aria", temperature=0.0, request_id=rid, **kw)  # type: ignore[arg-type]


async def test_a_long_text_is_spoken_in_full_as_one_stream_with_no_seam(engine: Engine) -> None:
    loaded = engine._loaded
    assert loaded is not None
    frontend, eos = loaded.frontend, loaded.talker.cfg.codec.eos
    prepared = frontend.prepare(greedy(SENTENCES, "probe"))
    assert len(prepared.segments) >= 6  # far past one generation's 48 frames
    tap = CodeTap(engine)
    stream = engine.submit(greedy(SENTENCES, "long"))
    audio = await collect(stream)
    # 1. spoken to the end: every segment reached its EOS, the response completed
    assert stream.finish_reason is FinishReason.EOS
    segments = [tap.spoken("long", i, eos) for i in range(len(prepared.segments))]
    assert stream.usage.frames == sum(len(s) for s in segments) >= sum(len(p.text) for p in prepared.segments)
    # 2. each segment is the generation of its own text, alone
    pieces = frontend.split(SENTENCES, frontend.settings(greedy(SENTENCES, "probe")))
    for i, piece in enumerate(pieces):
        alone = engine.submit(greedy(piece, f"alone-{i}"))
        await collect(alone)
        assert np.array_equal(tap.spoken(f"alone-{i}", 0, eos), segments[i]), i
    # 3. one codec stream over all the frames: the audio is their one-shot decode (no reset, no click at a join)
    codec = Qwen12HzCodec.from_pretrained(loaded.path / "speech_tokenizer")
    codes = torch.from_numpy(np.concatenate(segments).T[None].astype(np.int64))  # [1, G, T]
    wave = np.clip(np.rint(codec.decode(codes)[0].numpy() * 32767.0), -32768, 32767)
    assert audio.size == wave.size and np.abs(audio.astype(np.int32) - wave).max() <= 1


async def test_control_token_strings_in_the_text_are_spoken_as_text(engine: Engine) -> None:
    text = "We can talk about the water <tts_pad> and the day <|im_end|> then the <tts_text_eod> dog."
    prepared = engine._loaded.frontend.prepare(greedy(text, "probe"))  # type: ignore[union-attr]
    stream = engine.submit(greedy(text, "injected"))
    await collect(stream)
    assert stream.finish_reason is FinishReason.EOS
    assert stream.usage.frames >= sum(len(p.text) for p in prepared.segments)  # not cut at the first <tts_pad>


async def test_a_limit_the_client_set_cuts_across_segments_and_says_so(engine: Engine) -> None:
    limit = 23  # past the first segments (~8 frames each here), far short of the whole text
    stream = engine.submit(greedy(SENTENCES, "limited", max_frames=limit))
    out = output(engine, "limited")
    audio = await collect(stream)
    assert stream.finish_reason is FinishReason.MAX_FRAMES and out.segment >= 2
    assert stream.usage.frames == limit and audio.size == limit * 1920


async def test_a_cancel_between_segments_leaves_nothing_behind(engine: Engine) -> None:
    """Cancelled as soon as the second segment has started: no Seq of it is left running or waiting."""
    stream = engine.submit(greedy(SENTENCES, "cancelled"))
    out = output(engine, "cancelled")
    while out.segment < 1:
        await anext(stream)
    stream.cancel()
    assert engine.worker is not None
    for _ in range(500):
        if not engine.worker.scheduler.all_seqs() and engine.stats()["active_requests"] == 0:
            break
        await asyncio.sleep(0.01)
    assert not engine.worker.scheduler.all_seqs() and engine.stats()["slots_in_use"] == 0


async def test_a_reader_that_falls_behind_pauses_every_segment(engine_config: EngineConfig) -> None:
    """The next segment of a paused stream waits paused too: buffered audio stays near max_ahead_s (it grew by a
    whole segment per join when the segment's Seq ignored the pause)."""
    # one slot: the next segment waits for the last one's slot, and a pause meets it waiting
    e = Engine(dataclasses.replace(engine_config, max_frames=SEGMENT_FRAMES, max_ahead_s=0.5, max_batch=1))
    await e.start()
    try:
        stream = e.submit(greedy(SENTENCES * 2, "slow"))
        out = output(e, "slow")
        assert e.worker is not None
        sched = e.worker.scheduler
        for _ in range(3000):  # read nothing until a later segment's Seq sits paused (or everything ran)
            seq = sched.by_id.get("slow")
            if stream.done or (seq is not None and seq.segment >= 1 and seq.status.value == "paused"):
                break
            await asyncio.sleep(0.01)
        assert stream.paused and not stream.done and out.segment >= 1
        assert stream.buffered_seconds <= 0.5 + 1.0  # the limit, plus what is in flight when it is reached
        async for _ in stream:  # and it still ends, once read
            pass
        assert stream.finish_reason is FinishReason.EOS
    finally:
        await e.stop()

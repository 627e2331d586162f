"""Word timestamps through the engine (`--aligner`): each segment's words, timed by the aligner on that segment's own
audio as the stream delivered it and offset by where the segment starts; the audio itself unchanged."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from common.request import FinishReason, RequestError, SpeechRequest, StreamingSpeechRequest
from engine.aligner.aligner import Aligner
from engine.aligner.process import AlignerProcess
from engine.aligner.words import Clip
from engine.aligning import Alignment
from engine.config import EngineConfig
from engine.engine import Engine
from output_builder.streams import AudioStream, Timestamps
from talker.models.qwen3_tts.config import CheckpointError
from tests.engine.aligner.test_aligner import CHECKPOINT

RATE = 24000


@pytest.fixture
async def aligned(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    # a segment holds at most 20 text tokens (160 frames): a short text makes several segments
    e = Engine(dataclasses.replace(engine_config, aligner=str(CHECKPOINT), max_frames=160))
    await e.start()
    yield e
    await e.stop()


@pytest.fixture(scope="module")
def reference() -> Aligner:
    return Aligner(CHECKPOINT)


async def read(stream: AudioStream) -> tuple[np.ndarray, list[Timestamps], list[int]]:
    """The audio, the timestamps, and how much audio (samples) had come when each came."""
    pcm: list[np.ndarray] = []
    stamps: list[Timestamps] = []
    heard: list[int] = []
    async for item in stream.events():
        if isinstance(item, Timestamps):
            stamps.append(item)
            heard.append(sum(p.size for p in pcm))
        else:
            pcm.append(item)
    return np.concatenate(pcm), stamps, heard


def request(text: str, rid: str, timestamps: bool = True, **kw: object) -> SpeechRequest:
    return SpeechRequest(text=text, voice="aria", temperature=0.0, request_id=rid, timestamps=timestamps, **kw)


def check(audio: np.ndarray, stamps: list[Timestamps], heard: list[int], aligner: Aligner) -> None:
    """Each segment's words are the aligner's on that segment's served audio, offset by its start; each came after
    the whole of its segment's audio."""
    for ts, before in zip(stamps, heard, strict=True):
        assert ts.error is None
        start, end = round(ts.start * RATE), round(ts.end * RATE)
        assert before >= end - 1
        [words] = aligner.align([Clip(audio[start:end], RATE, ts.text, "english")])
        want = tuple((w.word, round(w.start + ts.start, 3), round(w.end + ts.start, 3)) for w in words)
        assert ts.words == want and len(want) > 0


async def test_each_segment_is_timed_on_its_own_audio(aligned: Engine, reference: Aligner) -> None:
    """(One engine for these checks: each start costs seconds.)"""
    # 1. pauses: each part a segment, its words after its audio, offset by where it starts
    text = "[pause:0.5] Hello there, how are you today? [pause:1] The quick brown fox jumps over the lazy dog."
    stream = aligned.submit(request(text, "ts", language="english"))
    audio, stamps, heard = await read(stream)
    assert stream.finish_reason is FinishReason.EOS
    assert [ts.segment for ts in stamps] == [0, 1]
    assert [ts.text for ts in stamps] == ["Hello there, how are you today?",
                                          "The quick brown fox jumps over the lazy dog."]
    assert stamps[0].start == 0.5 and stamps[1].start >= stamps[0].end + 1.0  # after the pauses
    check(audio, stamps, heard, reference)
    plain = aligned.submit(request(text, "plain", timestamps=False, language="english"))
    again, none, _ = await read(plain)
    assert np.array_equal(audio, again) and none == []  # the same audio; nothing for a request that did not ask
    # 2. a long text: one event per segment, in order
    loaded = aligned._loaded
    assert loaded is not None
    text = " ".join(f"Sentence number {n} is here to make the text long." for n in range(4))
    segments = loaded.frontend.prepare(request(text, "probe", language="english")).texts
    assert len(segments) > 2
    audio, stamps, heard = await read(aligned.submit(request(text, "long", language="english")))
    assert [ts.text for ts in stamps] == list(segments)
    assert all(a.end <= b.start for a, b in itertools.pairwise(stamps))
    check(audio, stamps, heard, reference)
    # 3. a cancelled request ends at once, its timestamps never awaited
    stream = aligned.submit(request("Hello there, how are you today?", "gone"))
    await anext(stream)
    stream.cancel()
    assert stream.done and stream.finish_reason is FinishReason.CANCELLED
    assert [item async for item in stream.events()] == []
    # 4. a text that arrives over time has no segments to time
    with pytest.raises(RequestError, match="arrives over time") as err:
        aligned.submit(StreamingSpeechRequest(text="Hello", voice="aria", timestamps=True))
    assert err.value.param == "timestamps"


async def test_timestamps_need_an_aligner(engine: Engine) -> None:
    with pytest.raises(RequestError, match="--aligner") as err:
        engine.submit(request("Hello.", "no-aligner"))
    assert err.value.param == "timestamps"


async def test_an_aligner_that_cannot_be_used_stops_the_start(engine_config: EngineConfig, tmp_path: Path) -> None:
    e = Engine(dataclasses.replace(engine_config, aligner=str(tmp_path)))  # no checkpoint: refused before any start
    try:
        with pytest.raises(CheckpointError, match=r"missing config\.json"):
            await e.start()
    finally:
        await e.stop()
    broken = tmp_path / "aligner"  # the files are there, but the process cannot load them: the start fails too
    shutil.copytree(CHECKPOINT, broken)
    (broken / "config.json").write_text(json.dumps({"model_type": "qwen3_asr"}))  # no thinker_config
    alignment = Alignment(AlignerProcess(broken, 1, tmp_path / "cache"), RATE)
    try:
        with pytest.raises(CheckpointError, match="not a Qwen3-ForcedAligner checkpoint"):
            await alignment.start()
    finally:
        await alignment.close()

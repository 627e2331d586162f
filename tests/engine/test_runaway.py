"""No runaway audio: a model that never says its end of speech stops at the length its text allows, and one caught
in a loop stops when it has repeated itself; either way the response says why, and nothing of it keeps running.

The official CustomVoice fixture never reaches EOS (its greedy output runs to any cap). A copy of it whose codec
head is all zeros gives every code the same logit, so its greedy codebook 0 is one code forever: a loop."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from common.request import FinishReason, SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine
from output_builder.repetition import LOOP_S
from output_builder.streams import AudioStream
from tests.conftest import OFFICIAL_TINY
from tests.engine.conftest import output

LONG = ("The quick brown fox jumps over the lazy dog. Then it runs to the water, and it looks at the day. "
        "We can talk about the sound of the voice; it is a tiny test of a long stream.")


def greedy(text: str, rid: str, **kw: object) -> SpeechRequest:
    return SpeechRequest(text=text, voice="ryan", temperature=0.0, repetition_penalty=1.0, request_id=rid,
                         **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def looping(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("looping") / "cv"
    shutil.copytree(OFFICIAL_TINY, path)
    weights = load_file(str(path / "model.safetensors"))
    weights["talker.codec_head.weight"] = np.zeros_like(weights["talker.codec_head.weight"])
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


async def served(config: EngineConfig) -> AsyncIterator[Engine]:
    e = Engine(config)
    await e.start()
    try:
        yield e
    finally:
        await e.stop()


@pytest.fixture
async def never_ends(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    async for e in served(dataclasses.replace(engine_config, model=str(OFFICIAL_TINY), max_frames=600)):
        yield e


@pytest.fixture
async def loops(engine_config: EngineConfig, looping: Path) -> AsyncIterator[Engine]:
    # segments of 200 // 8 = 25 text tokens: LONG is several, each one far longer than a loop takes to show
    async for e in served(dataclasses.replace(engine_config, model=str(looping), max_frames=200)):
        yield e


async def collect(stream: AudioStream) -> np.ndarray:
    return np.concatenate([c async for c in stream])


async def settled(engine: Engine) -> dict[str, int]:
    """The engine's stats once the worker holds nothing (it retires an aborted Seq at its next step boundary)."""
    assert engine.worker is not None
    for _ in range(500):
        if not engine.worker.scheduler.all_seqs():
            break
        await asyncio.sleep(0.01)
    return engine.stats()


async def test_a_model_that_never_ends_stops_at_its_texts_cap(never_ends: Engine) -> None:
    frontend = never_ends._loaded.frontend  # type: ignore[union-attr]
    prepared = frontend.prepare(greedy("hello world", "probe"))
    cap = prepared.caps[0]
    assert cap == frontend.cap_floor + 8 * len(prepared.prompt.text) < 600  # the text's cap, not the server's
    stream = never_ends.submit(greedy("hello world", "short"))
    audio = await collect(stream)
    assert stream.finish_reason is FinishReason.SPEECH_CAP
    assert stream.usage.frames == cap and audio.size == cap * 1920
    assert (await settled(never_ends))["slots_in_use"] == 0


async def test_a_client_limit_under_the_cap_is_still_the_clients(never_ends: Engine) -> None:
    stream = never_ends.submit(greedy("hello world", "limited", max_frames=30))
    await collect(stream)
    assert stream.finish_reason is FinishReason.MAX_FRAMES and stream.usage.frames == 30


async def test_a_loop_ends_each_segment_and_the_next_one_still_speaks(loops: Engine) -> None:
    frontend = loops._loaded.frontend  # type: ignore[union-attr]
    segments = len(frontend.prepare(greedy(LONG, "probe")).segments)
    assert segments >= 3
    loop = round(LOOP_S * frontend.frame_rate)  # frames of one code repeated (period 1)
    stream = loops.submit(greedy(LONG, "looping"))
    out = output(loops, "looping")
    audio = await collect(stream)
    assert stream.finish_reason is FinishReason.REPETITION
    assert out.segment == segments - 1  # every segment was started, none left out
    assert stream.usage.frames == segments * loop and audio.size == segments * loop * 1920
    assert (await settled(loops))["slots_in_use"] == 0


async def test_a_streamed_text_is_capped_once_it_has_ended(never_ends: Engine) -> None:
    from common.request import StreamingSpeechRequest

    handle = never_ends.submit(StreamingSpeechRequest(text="hello", voice="ryan", temperature=0.0,
                                                      repetition_penalty=1.0, request_id="streamed"))
    handle.append(" world")
    handle.finish()
    out = output(never_ends, "streamed")
    await collect(handle.stream)
    assert handle.stream.finish_reason is FinishReason.SPEECH_CAP
    assert out.caps and handle.stream.usage.frames == out.caps[0] < 600
    assert (await settled(never_ends))["slots_in_use"] == 0

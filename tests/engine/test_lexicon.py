"""A lexicon's respelling is spoken as if the respelled text had been sent: the same audio (greedy), and the text as
spoken is the response's transcript. Reloading takes a changed file; a broken one leaves the lexicon in use."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from common.request import FinishReason, SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine
from frontend.lexicon import LexiconError
from output_builder.streams import AudioStream


@pytest.fixture
def lexicon_file(tmp_path: Path) -> Path:
    path = tmp_path / "lexicon.json"
    path.write_text(json.dumps({"SQL": "sequel", "Nguyen": "win"}), encoding="utf-8")
    return path


@pytest.fixture
async def engine(engine_config: EngineConfig, lexicon_file: Path) -> AsyncIterator[Engine]:
    e = Engine(dataclasses.replace(engine_config, lexicon=lexicon_file))
    await e.start()
    yield e
    await e.stop()


async def say(engine: Engine, text: str) -> tuple[np.ndarray, AudioStream]:
    stream = engine.submit(SpeechRequest(text=text, voice="aria", temperature=0.0))
    audio = np.concatenate([c async for c in stream])
    assert stream.finish_reason is FinishReason.EOS
    return audio, stream


async def test_a_respelling_sounds_as_the_respelled_text_does(engine: Engine) -> None:
    respelled, plain_stream = await say(engine, "Mister win knows sequel well.")
    audio, stream = await say(engine, "Mister Nguyen knows SQL well.")
    assert np.array_equal(audio, respelled)
    assert stream.transcript == plain_stream.transcript == "Mister win knows sequel well."


async def test_reloading_takes_a_changed_file_and_keeps_the_old_one_on_a_broken_file(
        engine: Engine, lexicon_file: Path) -> None:
    lexicon_file.write_text(json.dumps({"SQL": "ess queue ell"}), encoding="utf-8")
    assert engine.reload_lexicon() == 1
    _, stream = await say(engine, "Mister Nguyen knows SQL.")
    assert stream.transcript == "Mister Nguyen knows ess queue ell."
    lexicon_file.write_text("{broken", encoding="utf-8")
    with pytest.raises(LexiconError, match="not UTF-8 JSON"):
        engine.reload_lexicon()
    _, stream = await say(engine, "SQL.")
    assert stream.transcript == "ess queue ell."


async def test_a_broken_lexicon_stops_the_start_with_its_fault(engine_config: EngineConfig, tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('["not", "an", "object"]', encoding="utf-8")
    e = Engine(dataclasses.replace(engine_config, lexicon=path))
    with pytest.raises(LexiconError, match="must be a JSON object"):
        await e.start()
    await e.stop()

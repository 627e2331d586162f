"""A text with numbers and symbols is spoken as its transcript (the text as read out) is: the same audio (greedy)
whether the language is named or detected; `normalize: false` sends the text as it is."""

from __future__ import annotations

import pytest

from common.request import FinishReason, SpeechRequest
from engine.engine import Engine
from output_builder.streams import AudioStream

TEXT = "It costs $3.50 at 7:30 pm, 42% off 1,200 items."


async def say(engine: Engine, text: str, **kw: object) -> tuple[bytes, AudioStream]:
    stream = engine.submit(SpeechRequest(text=text, voice="aria", temperature=0.0, **kw))  # type: ignore[arg-type]
    audio = b"".join([c.tobytes() async for c in stream])
    assert stream.finish_reason is FinishReason.EOS
    return audio, stream


@pytest.mark.parametrize("language", ["english", None])
async def test_a_text_sounds_as_its_transcript(engine: Engine, language: str | None) -> None:
    audio, stream = await say(engine, TEXT, language=language)
    assert stream.transcript == ("It costs three dollars fifty cents at seven thirty p m, forty-two percent off one "
                                 "thousand two hundred items.")
    again, echo = await say(engine, stream.transcript, language=language)
    assert again == audio and echo.transcript == stream.transcript


async def test_normalize_false_sends_the_text_as_it_is(engine: Engine) -> None:
    audio, _ = await say(engine, TEXT, language="english")
    raw, stream = await say(engine, TEXT, language="english", normalize=False)
    assert stream.transcript == TEXT and raw != audio

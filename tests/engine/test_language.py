"""A text whose language is left out (or "auto") is spoken as if its language had been named: the same audio
(greedy), each segment in its own language, the language reported; a named language is left as it is; a streamed
text, with nothing to detect from as it starts, goes to the model with none, as before."""

from __future__ import annotations

import pytest

from common.request import FinishReason, SpeechRequest, StreamingSpeechRequest
from engine.engine import Engine
from output_builder.streams import AudioStream

ENGLISH = "The weather is lovely today, and we are going for a walk."
CHINESE = "今天天气很好，我们一起去公园散步吧。"


async def say(engine: Engine, text: str, language: str | None = None) -> tuple[bytes, AudioStream]:
    stream = engine.submit(SpeechRequest(text=text, voice="aria", temperature=0.0, language=language))
    audio = b"".join([c.tobytes() async for c in stream])
    assert stream.finish_reason is FinishReason.EOS
    return audio, stream


@pytest.mark.parametrize(("text", "language"), [(ENGLISH, "english"), (CHINESE, "chinese")])
async def test_an_unnamed_language_sounds_as_the_named_one(engine: Engine, text: str, language: str) -> None:
    named, named_stream = await say(engine, text, language)
    for unnamed in (None, "auto", "AUTO"):
        audio, stream = await say(engine, text, unnamed)
        assert audio == named and stream.language == language == named_stream.language
    frontend = engine._loaded.frontend  # type: ignore[union-attr]
    other = "chinese" if language == "english" else "english"
    assert frontend.prepare(SpeechRequest(text=text, voice="aria", language=other)).prompt != \
        frontend.prepare(SpeechRequest(text=text, voice="aria")).prompt  # the language reaches the prompt


async def test_each_segment_gets_its_own_language(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    frontend = engine._loaded.frontend  # type: ignore[union-attr]
    monkeypatch.setattr(frontend, "max_frames", 160)  # segments of 20 text tokens: a sentence each
    p = frontend.prepare(SpeechRequest(text=f"{ENGLISH} {CHINESE}", voice="aria"))
    assert p.detected is not None and len(p.detected) >= 2
    assert p.detected[0] == p.language == "english" and p.detected[-1] == "chinese"
    english, chinese = (frontend.prepare(SpeechRequest(text="x", voice="aria", language=lang)).prompt.codec_prefix
                        for lang in ("english", "chinese"))
    assert p.segments[0].codec_prefix == english and p.segments[-1].codec_prefix == chinese


async def test_a_named_language_is_kept_and_a_streamed_text_detects_none(engine: Engine) -> None:
    frontend = engine._loaded.frontend  # type: ignore[union-attr]
    named = frontend.prepare(SpeechRequest(text=CHINESE, voice="aria", language="english"))
    assert named.language == "english" and named.detected is None
    handle = engine.submit(StreamingSpeechRequest(text=ENGLISH, voice="aria", temperature=0.0))
    handle.finish()
    b"".join([c.tobytes() async for c in handle.stream])
    assert handle.stream.language is None


async def test_detection_off_leaves_the_language_to_the_model(engine: Engine) -> None:
    frontend = engine._loaded.frontend  # type: ignore[union-attr]
    detected = frontend.prepare(SpeechRequest(text=ENGLISH, voice="aria"))
    frontend.detects = False
    try:
        plain = frontend.prepare(SpeechRequest(text=ENGLISH, voice="aria"))
    finally:
        frontend.detects = True
    assert plain.language is None and plain.detected is None and detected.detected == ("english",)
    assert plain.prompt != detected.prompt

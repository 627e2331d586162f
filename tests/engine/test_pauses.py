"""`[pause:N]`: exact digital silence of N seconds between the spoken parts, the codec's state running on across it
as across a long text's segments: the audio is the one-shot decode of every part's frames with the silence spliced in
where the part before it ends. A pause may open or close the text too."""

from __future__ import annotations

import numpy as np
import torch

from common.request import FinishReason, SpeechRequest
from engine.engine import Engine
from output_builder.codecs.qwen12hz import Qwen12HzCodec
from tests.engine.test_long_text import CodeTap, collect

RATE = 24000
FRAME = 1920


def greedy(text: str, rid: str) -> SpeechRequest:
    return SpeechRequest(text=text, voice="aria", temperature=0.0, request_id=rid)


def silent_runs(audio: np.ndarray) -> list[int]:
    """Lengths of the runs of exact zeros (samples)."""
    zero = np.concatenate([[0], (audio == 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(zero))
    return (edges[1::2] - edges[::2]).tolist()


async def test_a_pause_is_exact_silence_spliced_into_one_codec_stream(engine: Engine) -> None:
    loaded = engine._loaded
    assert loaded is not None
    eos = loaded.talker.cfg.codec.eos
    text = "[pause:0.5] Hello there. [pause:1.0] Nice to meet you. [pause:0.25]"
    prepared = loaded.frontend.prepare(greedy(text, "probe"))
    assert prepared.pauses == (0.5, 1.0, 0.25) and len(prepared.segments) == 2
    assert prepared.spoken == "[pause:0.5] Hello there. [pause:1] Nice to meet you. [pause:0.25]"
    tap = CodeTap(engine)
    stream = engine.submit(greedy(text, "paused"))
    audio = await collect(stream)
    assert stream.finish_reason is FinishReason.EOS and stream.transcript == prepared.spoken
    first, second = (tap.spoken("paused", i, eos) for i in range(2))
    codec = Qwen12HzCodec.from_pretrained(loaded.path / "speech_tokenizer")
    codes = torch.from_numpy(np.concatenate([first, second]).T[None].astype(np.int64))  # [1, G, T]
    wave = np.clip(np.rint(codec.decode(codes)[0].numpy() * 32767.0), -32768, 32767)
    cut = len(first) * FRAME
    want = np.concatenate([np.zeros(RATE // 2), wave[:cut], np.zeros(RATE), wave[cut:], np.zeros(RATE // 4)])
    assert audio.size == want.size and np.abs(audio.astype(np.int32) - want).max() <= 1
    assert np.array_equal(audio[: RATE // 2], np.zeros(RATE // 2))  # exact zeros, not merely quiet
    assert max(silent_runs(audio[RATE // 2 : -RATE // 4])) >= 0.95 * RATE
    assert stream.usage.frames == len(first) + len(second)


async def test_text_without_tags_is_spoken_as_before(engine: Engine) -> None:
    plain = await collect(engine.submit(greedy("Hello there. Nice to meet you.", "plain")))
    again = await collect(engine.submit(greedy("Hello there. Nice to meet you.", "again")))
    assert np.array_equal(plain, again) and max(silent_runs(plain), default=0) < RATE // 2

"""Cloned and designed voices through the real engine (codec process, async output), against the official package's
greedy audio for the Base and VoiceDesign fixtures: x-vector only, in-context cloning (whose codec hears the
reference first), and a voice described in words. Alone, and batched with each other."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from common.request import ClonePrompt, RequestError, SpeechRequest, StreamingSpeechRequest, VoiceKind
from engine.config import EngineConfig
from engine.engine import Engine
from tests.conftest import OFFICIAL_BASE, OFFICIAL_VD, VOICE_REF, VOICE_REF_TEXT

pytestmark = pytest.mark.bitexact
TEXTS = ["hello world this is a tiny test", "the quick brown fox jumps over the lazy dog"]
DESIGN = "A calm, deep male voice, speaking slowly."
FRAMES = 59  # the official calls' max_new_tokens=60 stopped at 59 frames, none at EOS


def greedy(text: str, **fields: object) -> SpeechRequest:
    return SpeechRequest(text=text, language="English", temperature=0.0, repetition_penalty=1.0, max_frames=FRAMES,
                         **fields)  # type: ignore[arg-type]


def clone(in_context: bool) -> ClonePrompt:
    ref = np.load(str(OFFICIAL_BASE) + ".reference.npz")
    x_vector = tuple(float(v) for v in ref["prompt_ref_spk_embedding"])
    if not in_context:
        return ClonePrompt(x_vector)
    return ClonePrompt(x_vector, tuple(tuple(int(c) for c in f) for f in ref["prompt_ref_code"]), VOICE_REF_TEXT)


async def audio(engine: Engine, requests: list[SpeechRequest]) -> list[np.ndarray]:
    streams = engine.submit_many(requests)
    pcm = [b"".join([bytes(c) async for c in s]) for s in streams]
    return [np.frombuffer(p, "<i2").astype(np.float64) / 32767 for p in pcm]


def close_to(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape == (FRAMES * 1920,)
    return float(np.abs(got - want).max())


@pytest.fixture
async def base(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    e = Engine(replace(engine_config, model=str(OFFICIAL_BASE)).tuned(warmup=True))  # a Base warm-up has no voice
    await e.start()
    yield e
    await e.stop()


async def test_cloned_voices_speak_as_the_official_package_alone_and_batched(base: Engine) -> None:
    ref = np.load(str(OFFICIAL_BASE) + ".reference.npz")
    cases = [(f"{mode}_w{i}", greedy(text, clone=clone(mode == "icl"))) for mode in ("icl", "xvec")
             for i, text in enumerate(TEXTS)]
    assert base.voice_kind is VoiceKind.BASE
    for key, request in cases:  # alone, as the official package ran them
        (got,) = await audio(base, [request])
        assert close_to(got, ref[key]) < 1e-4, key
    together = await audio(base, [replace(r, request_id=f"b{i}") for i, (_, r) in enumerate(cases)])
    for (key, _), got in zip(cases, together, strict=True):
        assert close_to(got, ref[key]) < 1e-4, key


async def test_a_recording_becomes_the_official_clone_prompt_and_speaks_with_it(base: Engine) -> None:
    """The reference wav through both encoders (on the engine's voice-encoder thread): the official codes exactly,
    the official x-vector within 1e-4, and the official in-context audio."""
    ref = np.load(str(OFFICIAL_BASE) + ".reference.npz")
    wav, rate = sf.read(str(VOICE_REF), dtype="float32")
    assert rate == 24000
    prompt = await base.clone_prompt(wav, VOICE_REF_TEXT)
    assert prompt.ref_codes is not None and np.array_equal(np.array(prompt.ref_codes), ref["prompt_ref_code"])
    assert np.abs(np.array(prompt.x_vector) - ref["prompt_ref_spk_embedding"]).max() < 1e-4
    (got,) = await audio(base, [greedy(TEXTS[0], clone=prompt)])
    assert close_to(got, ref["icl_w0"]) < 1e-4
    x_only = await base.clone_prompt(wav, None)
    assert x_only.ref_codes is None and x_only.x_vector == prompt.x_vector


async def test_a_text_that_arrives_over_time_speaks_with_a_cloned_voice(base: Engine) -> None:
    """x-vector voices take streamed text: the same audio as the whole text given at once (Base's own layout)."""
    whole = greedy(TEXTS[1], clone=clone(False), request_id="whole")
    (want,) = await audio(base, [whole])
    fields = {f.name: getattr(whole, f.name) for f in dataclasses.fields(whole)}
    handle = base.submit(StreamingSpeechRequest(**{**fields, "text": "", "request_id": "streamed"}))
    for i, word in enumerate(TEXTS[1].split(" ")):
        handle.append(word if i == 0 else " " + word)
    handle.finish()
    got = b"".join([bytes(c) async for c in handle.stream])
    assert np.array_equal(np.frombuffer(got, "<i2").astype(np.float64) / 32767, want)


async def test_a_base_model_names_what_it_needs(base: Engine) -> None:
    with pytest.raises(RequestError, match="POST /v1/audio/voices"):
        base.submit(SpeechRequest(text="hi", voice="alloy"))
    with pytest.raises(RequestError, match="x-vector has 3 values"):
        base.submit(SpeechRequest(text="hi", clone=ClonePrompt((0.0, 1.0, 2.0))))


async def test_a_designed_voice_speaks_as_the_official_package(engine_config: EngineConfig) -> None:
    ref = np.load(str(OFFICIAL_VD) + ".reference.npz")
    engine = Engine(replace(engine_config, model=str(OFFICIAL_VD)))
    await engine.start()
    try:
        assert engine.voice_kind is VoiceKind.VOICE_DESIGN
        requests = [greedy(text, instructions=DESIGN, request_id=f"vd{i}") for i, text in enumerate(TEXTS)]
        for i, request in enumerate(requests):
            (got,) = await audio(engine, [replace(request, request_id=f"alone{i}")])
            assert close_to(got, ref[f"vd_w{i}"]) < 1e-4
        for i, got in enumerate(await audio(engine, requests)):
            assert close_to(got, ref[f"vd_w{i}"]) < 1e-4
        with pytest.raises(RequestError, match="needs a Base"):
            engine.submit(greedy("hi", clone=clone(False)))
        with pytest.raises(RequestError, match="cannot clone"):
            await engine.clone_prompt(np.zeros(24000, np.float32), None)
    finally:
        await engine.stop()


from pathlib import Path

import pytest

from talker.models.frontend import OPENAI_VOICES, Frontend, load_tokenizer
from talker.models.qwen3_tts.config import GenerationDefaults, Qwen3TTSConfig
from talker.request import RequestError, SpeechRequest


@pytest.fixture
def frontend(tiny_dir: Path) -> Frontend:
    return Frontend(Qwen3TTSConfig.load(tiny_dir), GenerationDefaults.load(tiny_dir), load_tokenizer(tiny_dir),
                    max_frames=100, text_width=64, max_prompt=128)


@pytest.mark.parametrize(
    ("request_kwargs", "param"),
    [
        ({"text": ""}, "input"),
        ({"text": "   "}, "input"),
        ({"text": "x" * 4097}, "input"),
        ({"text": "hi", "instructions": "word " * 200}, "instructions"),
        ({"text": "hi", "voice": ""}, "voice"),
        ({"text": "hi", "voice": " "}, "voice"),
        ({"text": "hi", "voice": "nobody"}, "voice"),
        ({"text": "hi", "language": "klingon"}, "language"),
        ({"text": "hi", "temperature": 5.0}, "temperature"),
        ({"text": "hi", "top_p": 0.0}, "top_p"),
        ({"text": "hi", "top_k": -1}, "top_k"),
        ({"text": "hi", "repetition_penalty": 0.0}, "repetition_penalty"),
        ({"text": "hi", "max_frames": 0}, "max_frames"),
        ({"text": "hi", "seed": -1}, "seed"),
    ],
)
def test_bad_input_is_a_request_error_naming_the_field(
    frontend: Frontend, request_kwargs: dict[str, object], param: str
) -> None:
    with pytest.raises(RequestError) as info:
        frontend.prepare(SpeechRequest(**request_kwargs))  # type: ignore[arg-type]
    assert info.value.param == param


def test_unknown_voice_lists_the_available_ones(frontend: Frontend) -> None:
    with pytest.raises(RequestError, match=r"available voices: .*alloy.*aria"):
        frontend.prepare(SpeechRequest(text="hi", voice="nobody"))


def test_openai_voices_map_onto_checkpoint_speakers(frontend: Frontend) -> None:
    speakers = set(frontend.cfg.speakers)
    for name in OPENAI_VOICES:
        assert frontend.voices[name].speaker in speakers
    assert frontend.speaker_for("ALLOY") in speakers
    assert frontend.speaker_for(None) == frontend.default_voice


def test_unset_sampling_fields_take_the_generation_config(frontend: Frontend) -> None:
    p = frontend.prepare(SpeechRequest(text="hi"))
    assert (p.params.temperature, p.params.top_k, p.params.repetition_penalty) == (0.9, 50, 1.05)
    greedy = frontend.prepare(SpeechRequest(text="hi", temperature=0.0)).params
    assert greedy.greedy and greedy.temperature == 0.0


@pytest.mark.parametrize("text", ["  Hi there  ", "\n\nHello", "tabs\tend\t"])
def test_a_text_that_fits_one_generation_is_tokenized_exactly_as_given(frontend: Frontend, text: str) -> None:
    prompt = frontend.prepare(SpeechRequest(text=text)).prompt
    assert prompt.text_ids == frontend.tokenizer.assistant(text)

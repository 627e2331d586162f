from pathlib import Path

import pytest

from common.request import ClonePrompt, RequestError, SpeechRequest
from frontend.frontend import OPENAI_VOICES, Frontend, load_tokenizer
from talker.models.qwen3_tts.config import GenerationDefaults, Qwen3TTSConfig
from tests.conftest import OFFICIAL_BASE, OFFICIAL_TINY, OFFICIAL_VD


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


def frontend_for(directory: Path) -> Frontend:
    return Frontend(Qwen3TTSConfig.load(directory), GenerationDefaults.load(directory), load_tokenizer(directory),
                    max_frames=100, text_width=64, max_prompt=256)


def test_each_kind_of_checkpoint_takes_its_official_default_layout_and_its_own_voices() -> None:
    """CustomVoice and VoiceDesign: the whole text in the prompt; Base (cloning): the text fed along, as the
    official package's defaults per task have it. VoiceDesign's names are descriptions; Base has none built in."""
    cv, base, vd = (frontend_for(d) for d in (OFFICIAL_TINY, OFFICIAL_BASE, OFFICIAL_VD))
    clone = ClonePrompt((0.5,) * 64)
    assert not cv.prepare(SpeechRequest(text="hi", voice="ryan")).prompt.streaming_text
    assert not vd.prepare(SpeechRequest(text="hi")).prompt.streaming_text
    assert base.prepare(SpeechRequest(text="hi", clone=clone)).prompt.streaming_text
    assert base.voices == {} and set(vd.voices) == set(OPENAI_VOICES)
    described = vd.prepare(SpeechRequest(text="hi", voice="onyx", instructions="Whisper."))
    expected = vd.tokenizer.instruct(f"{vd.voices['onyx'].description}\nWhisper.")
    assert described.prompt.instruct_ids == expected
    assert vd.prepare(SpeechRequest(text="hi")).prompt.instruct_ids is None  # no voice, no instruction: plain
    cloned = base.prepare(SpeechRequest(text="hi", clone=clone, instructions="ignored, as officially"))
    assert cloned.prompt.speaker_vector == clone.x_vector and cloned.prompt.instruct_ids is None


@pytest.mark.parametrize(
    ("kind", "request_kwargs", "message"),
    [
        ("base", {"voice": "alloy"}, "POST /v1/audio/voices"),
        ("base", {}, "ref_audio"),
        ("base", {"clone": ClonePrompt((0.0,) * 3)}, "x-vector has 3 values"),
        ("base", {"clone": ClonePrompt((0.0,) * 64, ((1,) * 5,), "hi")}, "16 codes per frame"),
        ("base", {"clone": ClonePrompt((0.0,) * 64, ((1,) * 16,), None)}, "transcript"),
        ("cv", {"clone": ClonePrompt((0.0,) * 64)}, "needs a Base"),
        ("vd", {"voice": "ryan"}, "unknown voice"),
    ],
)
def test_voice_mistakes_name_the_fix(kind: str, request_kwargs: dict[str, object], message: str) -> None:
    directory = {"base": OFFICIAL_BASE, "cv": OFFICIAL_TINY, "vd": OFFICIAL_VD}[kind]
    with pytest.raises(RequestError, match=message) as err:
        frontend_for(directory).prepare(SpeechRequest(text="hi", **request_kwargs))  # type: ignore[arg-type]
    assert err.value.param == "voice"


def test_an_in_context_voice_needs_the_whole_text_up_front() -> None:
    clone = ClonePrompt((0.0,) * 64, ((1,) * 16,), "a transcript")
    with pytest.raises(RequestError, match="whole text up front"):
        frontend_for(OFFICIAL_BASE).prepare_stream(SpeechRequest(text="", clone=clone))


def test_a_reference_that_leaves_no_room_is_refused_naming_its_field() -> None:
    """A transcript that could never leave an input room is refused by the field that carries it (at creation), and
    a request whose voice's reference takes the room blames the voice, never the instructions it did not send."""
    base = frontend_for(OFFICIAL_BASE)  # 256 prompt tokens
    base.check_reference("a short transcript", 59, "transcript")
    long = "word " * 200
    for param in ("transcript", "ref_text"):
        with pytest.raises(RequestError, match=rf"^{param} is too long .* at most \d+ tokens fit") as err:
            base.check_reference(long, 0, param)
        assert err.value.param == param
    with pytest.raises(RequestError, match="beside its recording's 240 frames"):
        base.check_reference("a short transcript", 240, "transcript")  # fits alone, not with its recording
    clone = ClonePrompt((0.0,) * 64, ((1,) * 16,) * 59, long)
    with pytest.raises(RequestError, match="reference is too long") as err:
        base.prepare(SpeechRequest(text="hi", clone=clone))
    assert err.value.param == "voice"


def test_a_description_that_leaves_no_room_is_refused_naming_its_field() -> None:
    """A designed voice's description that could never leave an input room is refused by `prompt` at creation, and
    a request speaking such a voice blames the voice; its own instructions that take the room still blame them."""
    vd = frontend_for(OFFICIAL_VD)  # 256 prompt tokens
    vd.check_design("A calm, deep male voice.", "prompt")
    long = "a calm voice " * 100
    with pytest.raises(RequestError, match=r"^prompt is too long .* at most \d+ tokens fit") as err:
        vd.check_design(long, "prompt")
    assert err.value.param == "prompt"
    with pytest.raises(RequestError, match="the voice's description is too long") as err:
        vd.prepare(SpeechRequest(text="hi", design=long))
    assert err.value.param == "voice"
    with pytest.raises(RequestError, match="instructions are too long") as err:
        vd.prepare(SpeechRequest(text="hi", design="A calm voice.", instructions=long))
    assert err.value.param == "instructions"


def test_a_seed_is_taken_to_its_low_31_bits(frontend: Frontend) -> None:
    """Documented (README, `seed`): seeds that differ only above bit 30 are one seed; the top of the range is taken."""
    seeds = [frontend.prepare(SpeechRequest(text="hi", seed=s)).seed for s in (5, 5 + 2**31, 5 + 2**62, 2**63 - 1)]
    assert seeds == [5, 5, 5, 2**31 - 1]
    with pytest.raises(RequestError):
        frontend.prepare(SpeechRequest(text="hi", seed=2**63))

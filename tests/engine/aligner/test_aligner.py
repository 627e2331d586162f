"""The forced aligner (engine/aligner/) against the official qwen-asr package's outputs for its tiny checkpoint:
the fixture's own four cases and seven more, two of them Korean (tests/fixtures/aligner_reference.json), alone and
in one batch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import soundfile as sf
import torch

from common.request import RequestFailedError
from engine.aligner.aligner import Aligner, Clip
from engine.aligner.korean import read_wordlist
from engine.aligner.model import audio_tokens
from engine.aligner.on_device import AlignerOnDevice
from engine.aligner.words import repair, split_words
from talker.models.qwen3_tts.config import CheckpointError
from tests.engine.aligner.aligner_clips import CASES, clip

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
OFFICIAL = FIXTURES / "official"
CHECKPOINT = OFFICIAL / "qwen3-forced-aligner-tiny-official"


def _read(path: Path) -> tuple:
    return sf.read(path, dtype="int16")


def _cases() -> list[tuple[str, Clip, list[tuple[str, float, float]]]]:
    out = []
    for i, case in enumerate(json.loads((CHECKPOINT / "reference.json").read_text())["cases"]):
        pcm, rate = _read(CHECKPOINT / case["audio"])
        words = [(w["word"], w["start_time"], w["end_time"]) for w in case["words"]]
        out.append((f"fixture-{i + 1}", Clip(pcm, rate, case["text"], case["language"]), words))
    for case in json.loads((FIXTURES / "aligner_reference.json").read_text())["cases"]:
        assert CASES[case["name"]]["text"] == case["text"], "aligner_clips.py changed: rerun the oracle script"
        pcm, rate = clip(case, _read, OFFICIAL)
        words = [(w["word"], w["start_time"], w["end_time"]) for w in case["words"]]
        out.append((case["name"], Clip(pcm, rate, case["text"], case["language"]), words))
    return out


CASE_LIST = _cases()


@pytest.fixture(scope="module")
def aligner(korean_wordlist: Path) -> Aligner:
    words = read_wordlist(korean_wordlist)
    return Aligner(CHECKPOINT, lambda: words)


def _words(result: list) -> list[tuple[str, float, float]]:
    return [(w.word, w.start, w.end) for w in result]


@pytest.mark.bitexact
@pytest.mark.parametrize("name", [c[0] for c in CASE_LIST])
def test_each_case_gives_the_official_words_and_times(aligner: Aligner, name: str) -> None:
    _, one, want = next(c for c in CASE_LIST if c[0] == name)
    assert _words(aligner.align([one])[0]) == want


@pytest.mark.bitexact
def test_a_batch_gives_what_each_clip_gives_alone(aligner: Aligner) -> None:
    clips = [c[1] for c in CASE_LIST]
    empty = Clip(clips[0].pcm, clips[0].rate, "— !?", "English")  # nothing to time
    got = aligner.align([*clips, empty])
    assert [_words(g) for g in got] == [c[2] for c in CASE_LIST] + [[]]


@pytest.mark.bitexact
def test_the_aligner_in_the_engines_process_on_the_test_device(korean_wordlist: Path, tmp_path: Path) -> None:
    """What the engine runs on CUDA (there on a CUDA stream of its own; scripts/gpu_check runs this on CUDA): on a CPU
    the official words and times bit for bit; on CUDA the official words, each time within one 80 ms class for 90% of
    them (its convolutions use TF32, its kernels sum in other orders, and the tiny random model's margins are small)."""
    device = torch.device(os.environ.get("TALKSTREAM_TEST_DEVICE", "cpu"))
    on_device = AlignerOnDevice(CHECKPOINT, device, korean_wordlist.parents[1])  # the cache the list is in
    assert on_device.languages() == Aligner(CHECKPOINT).languages
    got = on_device.align([c[1] for c in CASE_LIST])
    want = [c[2] for c in CASE_LIST]
    if device.type == "cpu":
        assert got == want
    else:
        assert [[w for w, _, _ in clip] for clip in got] == [[w for w, _, _ in clip] for clip in want]
        pairs = [(g, w) for gc, wc in zip(got, want, strict=True) for gw, ww in zip(gc, wc, strict=True)
                 for g, w in ((gw[1], ww[1]), (gw[2], ww[2]))]
        assert sum(abs(g - w) <= 0.08 for g, w in pairs) >= 0.9 * len(pairs)
    on_device.close()
    broken = tmp_path / "broken"
    broken.mkdir()
    with pytest.raises(RequestFailedError, match=r"missing checkpoint file: .*config\.json"):
        AlignerOnDevice(broken, device, tmp_path).languages()


def test_only_a_korean_text_asks_for_the_korean_word_list(korean_wordlist: Path) -> None:
    """The list may still be on its way from PyPI: a batch with no Korean text is aligned without asking for it."""
    asked: list[int] = []
    words = read_wordlist(korean_wordlist)

    def korean() -> frozenset[str]:
        asked.append(1)
        return words

    aligner = Aligner(CHECKPOINT, korean)
    others = [c for c in CASE_LIST if c[1].language != "Korean"]
    assert [_words(g) for g in aligner.align([c[1] for c in others])] == [c[2] for c in others]
    assert not asked
    korean_case = next(c for c in CASE_LIST if c[1].language == "Korean")
    assert _words(aligner.align([korean_case[1]])[0]) == korean_case[2]
    assert asked == [1]


def test_the_prompt_is_the_official_one(aligner: Aligner) -> None:
    for case in json.loads((CHECKPOINT / "reference.json").read_text())["cases"]:
        ids = aligner.prompt([w["word"] for w in case["words"]], 1)  # the audio run shown as one id
        assert ids == case["input_ids_one_audio_pad"]
        assert audio_tokens(case["n_mel_frames"]) == case["n_audio_tokens"]


def test_the_repair_of_out_of_order_times_is_the_official_one() -> None:
    for case in json.loads((CHECKPOINT / "reference.json").read_text())["cases"]:
        assert repair(case["raw_timestamps_ms"]) == case["fixed_timestamps_ms"]
    assert repair([]) == []
    assert repair([5.0, 1.0, 2.0, 3.0]) == [1, 1, 2, 3]  # a lone first outlier takes its right neighbour
    assert repair([0.0, 9.0, 1.0, 1.0, 12.0]) == [0, 0, 1, 1, 12]  # one slot between: its nearer, left on a tie
    assert repair([0.0, 50.0, 40.0, 30.0, 4.0, 5.0, 6.0, 8.0]) == [0, 1, 2, 3, 4, 5, 6, 8]  # three: a straight line


def test_words_are_cut_as_the_official_splitter_cuts_them() -> None:
    assert split_words("Don't stop: it's 3.14, OK?", "english") == ["Don't", "stop", "it's", "314", "OK"]
    assert split_words("nai\u0308ve—co-op 你好世界!", None) == ["naivecoop", "你", "好", "世", "界"]
    assert split_words("hello中文world", "chinese") == ["hello", "中", "文", "world"]
    assert split_words("  ... — !", "english") == []


def test_a_checkpoint_that_is_not_an_aligner_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_tts"}))
    with pytest.raises(CheckpointError, match="not a Qwen3-ForcedAligner"):
        Aligner(tmp_path)

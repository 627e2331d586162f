"""The checkpoint's tokenizer gives the official package's ids (tests/fixtures/tokenizer_reference.json, written by
scripts/oracle/make_tokenizer_reference.py) for every kind of tokenizer a checkpoint carries, and user text can
never become a control token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from frontend.tokenizer import TextTokenizer, load_tokenizer
from tests.conftest import OFFICIAL_TINY

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REFERENCE = json.loads((FIXTURES / "tokenizer_reference.json").read_text())
FILES = ["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"]
CONTROL = ("<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<|im_start|>", "<|im_end|>", "<|endoftext|>")


def checkpoint(kind: str, tmp: Path) -> Path:
    """The tokenizer files of `kind` as the reference script laid them out."""
    source = FIXTURES / "tokenizer-rules" if kind == "rules" else OFFICIAL_TINY
    for name in [*FILES, "tokenizer.json"] if kind == "json" else FILES:
        shutil.copy(source / name, tmp / name)
    return tmp


@pytest.fixture(scope="module", params=["json", "vocab", "rules"])
def kind(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, TextTokenizer]:
    return request.param, load_tokenizer(checkpoint(request.param, tmp_path_factory.mktemp(request.param)))


def plain_texts() -> list[str]:
    return [t for t in REFERENCE["texts"] if not any(c in t for c in CONTROL)]


@pytest.mark.parametrize("text", plain_texts())
def test_ids_are_the_official_ones(kind: tuple[str, TextTokenizer], text: str) -> None:
    name, tok = kind
    expected = REFERENCE["ids"][name][text]
    assert list(tok.assistant(text)) == expected["assistant"]
    assert list(tok.instruct(text)) == expected["instruct"]


@pytest.mark.parametrize("text", [t for t in REFERENCE["texts"] if t not in plain_texts()])
def test_control_token_strings_in_user_text_stay_ordinary_text(kind: tuple[str, TextTokenizer], text: str) -> None:
    """The official package turns them into control tokens (its ids differ here on purpose)."""
    name, tok = kind
    ids = tok.assistant(text)
    body = ids[3:-5]  # <|im_start|> assistant \n ... <|im_end|> \n <|im_start|> assistant \n
    control = {tok.ids["<|im_start|>"], tok.ids["<|im_end|>"], *range(0, 6)} if name != "rules" else set(range(6))
    assert not control & set(body)
    assert tok._plain.decode(list(body)) == text
    assert REFERENCE["ids"][name][text]["assistant"] != list(ids)  # the official ids do hold a control token
    assert set(tok.instruct(text)[3:-2]).isdisjoint(control)

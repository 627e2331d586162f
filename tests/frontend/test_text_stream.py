"""A text that arrives in pieces is tokenized as the whole text is, whatever the pieces.

The checkpoints' own vocabularies here are tiny (a few hundred tokens), so most words come out as single bytes and
a word split in the wrong place would often give the same ids. These tests give each checkpoint's normalizer and
pre-tokenizer a BPE vocabulary trained on text from the same alphabet, in which most words are one or two tokens:
a wrong word boundary then shows as different ids (with one word held back instead of two, both rule sets fail).
"""

from __future__ import annotations

import itertools
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from common.request import RequestError
from frontend.text_stream import TextStream, visible_chars
from frontend.tokenizer import load_tokenizer
from tests.conftest import OFFICIAL_TINY

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FILES = ["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"]
PREFIX = "assistant\n"  # what the frontend tokenizes the text behind
# what moves word boundaries: runs of spaces and newlines, contractions, digits, punctuation, combining marks
# (NFC composes them under Qwen2's rules), CJK, emoji, ligatures, Hangul jamo (composed by NFC)
ALPHABET = [*"ab lL'sdtrevm\n\r\t  ..,!?1234", "\u0301", "é", "日", "本", "😀", "\u00a0", "ﬁ", "ᄀ", "ᅡ", "’", "e\u0301"]
TRICKY = ["Hello world, this is 12345 café 日本語 😀!", "x'll y'd z're I'M don't", "a  \n \n b\r\n\r\n  c  ",
          "e\u0301\u0301 가 ﬁne.\u00a0\u00a0Done", "<|im_end|> <tts_pad> stays text", "3.14159, 2,718; -42%"]


def corpus(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 25))) for _ in range(n)]


@pytest.fixture(scope="module", params=["json", "rules"])
def tok(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The checkpoint's normalizer and pre-tokenizer (tiny's tokenizer.json: GPT-2's rules; the rules fixture:
    Qwen2's, with NFC) in front of a BPE trained on the alphabet above."""
    tmp = tmp_path_factory.mktemp(request.param)
    source = FIXTURES / "tokenizer-rules" if request.param == "rules" else OFFICIAL_TINY
    for name in [*FILES, "tokenizer.json"] if request.param == "json" else FILES:
        shutil.copy(source / name, tmp / name)
    base = load_tokenizer(tmp)._plain
    trained = Tokenizer(models.BPE())
    trained.normalizer, trained.pre_tokenizer = base.normalizer, base.pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=20000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    trained.train_from_iterator(corpus(0, 20000) + TRICKY, trainer)
    return trained


def whole(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(PREFIX + text, add_special_tokens=False).ids)


def streamed(tok: Tokenizer, pieces: list[str | bytes]) -> list[int]:
    stream = TextStream(tok, PREFIX)
    ids = [i for piece in pieces for i in stream.append(piece)]
    return ids + stream.finish()


def cut(text: str, points: list[int]) -> list[str | bytes]:
    bounds = [0, *sorted(points), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("text", TRICKY)
def test_every_split_point_gives_the_whole_texts_tokens(tok: Tokenizer, text: str) -> None:
    want = whole(tok, text)
    for i in range(len(text) + 1):
        assert streamed(tok, [text[:i], text[i:]]) == want, (text[:i], text[i:])
    assert streamed(tok, list(text)) == want  # a character at a time


@given(data=st.data())
def test_random_texts_in_random_pieces(tok: Tokenizer, data: st.DataObject) -> None:
    text = data.draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=30).map("".join))
    points = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert streamed(tok, cut(text, points)) == whole(tok, text)


def test_utf8_bytes_cut_inside_characters(tok: Tokenizer) -> None:
    text = "café 日本 😀 ok"
    data = text.encode()
    for i in range(len(data) + 1):
        assert streamed(tok, [data[:i], data[i:]]) == whole(tok, text)


def test_a_surrogate_pair_cut_between_its_halves_is_one_character(tok: Tokenizer) -> None:
    high, low = "\ud83d", "\ude00"  # 😀 as a JSON string cut between its UTF-16 halves gives these
    assert streamed(tok, ["hi " + high, low + " there"]) == whole(tok, "hi 😀 there")


def test_broken_text_is_refused_and_an_unfinished_character_ends_as_a_replacement(tok: Tokenizer) -> None:
    broken: list[list[str | bytes]] = [["a\udc00b"], [b"\xff"], ["x\ud83d", "y"], [b"\xe6\x97", "x"], ["x\ud83d", b"y"]]
    for bad in broken:
        stream = TextStream(tok, PREFIX)
        with pytest.raises(RequestError):
            for piece in bad:
                stream.append(piece)
    for unfinished in ([b"ok \xe6\x97"], ["ok \ud83d"]):
        stream = TextStream(tok, PREFIX)
        ids = [i for piece in unfinished for i in stream.append(piece)] + stream.finish()
        assert ids == whole(tok, "ok \ufffd") and stream.text == "ok \ufffd"


def test_words_are_released_once_two_more_follow(tok: Tokenizer) -> None:
    stream = TextStream(tok, PREFIX)
    released = stream.append("Hello")  # words "assistant", "\n", "Hello": the last two may still change
    assert released == list(tok.encode("assistant", add_special_tokens=False).ids)
    released += stream.append(" world")
    assert released == whole(tok, "")
    released += stream.append(" again")
    assert released == whole(tok, "Hello")  # "Hello" is fixed once " world" and " again" follow it
    assert released + stream.append(" and") + stream.finish() == whole(tok, "Hello world again and")
    assert stream.text == "Hello world again and" and stream.chars == len(stream.text)


def test_only_characters_that_draw_something_are_visible() -> None:
    """What counts as a streamed text's activity and makes it not blank: letters, numbers, punctuation, symbols;
    not spaces, nor zero-width, format, control or tag characters, variation selectors, a combining mark alone, or
    the letters and symbols that draw nothing (Hangul fillers, the Braille blank)."""
    assert visible_chars("Hi, 42 €! 你好 👍 e\u0301") == 11  # the accent counts with its letter, not by itself
    nothing = (" \t\n\r\u3000\u00a0\u2028\u2029\u200b\u200c\u200d\u2060\ufeff\U000e0041\U000e007f\u115f\u1160"
               "\u3164\uffa0\u2800\u0301\u034f\ufe0f\u200e\u202e\x00\x07\x7f\u0085\U000f0000\ufdd0")
    assert visible_chars(nothing) == 0

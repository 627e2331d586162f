"""Respellings replace whole words in any script and case, the longest entry first; a file that cannot be used is
refused whole with what is wrong in it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frontend.lexicon import Lexicon, LexiconError


def lexicon(tmp_path: Path, entries: object) -> Lexicon:
    path = tmp_path / "lexicon.json"
    path.write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")
    return Lexicon.load(path)


@pytest.mark.parametrize(("text", "want"), [
    ("Talkstream speaks SQL.", "Talkstream speaks sequel."),
    ("sql, Sql and sQl", "sequel, sequel and sequel"),
    ("mysql and sqlite are other words", "mysql and sqlite are other words"),  # whole words only
    ("SQL_table sql2 (sql)", "SQL_table sql2 (sequel)"),  # a digit or underscore touches the word
    ("Élan, ÉLAN and élan.", "ay-lahn, ay-lahn and ay-lahn."),  # case-insensitive beyond ASCII
    ("Qwen3 in New York City and New York", "kwen three in the big apple and new york"),  # the longest first
    ("北京欢迎你", "北京欢迎你"),  # a word inside an unspaced script is inside a word
    ("去 北京 吧", "去 Beijing 吧"),
])
def test_whole_words_are_respelled(tmp_path: Path, text: str, want: str) -> None:
    lex = lexicon(tmp_path, {"SQL": "sequel", "élan": "ay-lahn", "Qwen3": "kwen three", "New York": "new york",
                             "new york city": "the big apple", "北京": "Beijing"})
    assert lex.apply(text) == want
    assert len(lex) == 6


@pytest.mark.parametrize(("content", "fault"), [
    ("[1, 2]", "must be a JSON object"),
    ("{not json", "is not UTF-8 JSON"),
    ('{"sql": 3}', "must map a word to a non-empty string"),
    ('{"sql": " "}', "must map a word to a non-empty string"),
    ('{"": "x"}', "must map a word to a non-empty string"),
    ('{" sql": "x"}', "has spaces around it"),
    ('{"SQL": "a", "sql": "b"}', "are the same word"),
])
def test_a_file_that_cannot_be_used_is_refused_with_its_fault(tmp_path: Path, content: str, fault: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LexiconError, match=fault):
        Lexicon.load(path)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(LexiconError, match="cannot read the lexicon"):
        Lexicon.load(tmp_path / "absent.json")


def test_an_empty_lexicon_changes_nothing(tmp_path: Path) -> None:
    assert lexicon(tmp_path, {}).apply("Anything at all.") == "Anything at all."

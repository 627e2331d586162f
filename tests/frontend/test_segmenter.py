"""Splitting a long text at the best boundaries that fit a token budget."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frontend.segmenter import split_text


def words(text: str) -> int:
    return len(text.split())


def chars(text: str) -> int:
    return len(text)


def test_a_text_that_fits_is_one_piece_exactly_as_given() -> None:
    assert split_text("  One. Two.\n", 10, words) == ["  One. Two.\n"]


def test_sentences_are_packed_whole() -> None:
    text = "One two three. Four five. Six seven eight nine. Ten."
    assert split_text(text, 5, words) == ["One two three. Four five.", "Six seven eight nine. Ten."]


def test_a_long_sentence_is_cut_at_clauses_then_words() -> None:
    text = "alpha beta, gamma delta epsilon, zeta eta theta iota kappa lambda mu."
    assert split_text(text, 3, words) == ["alpha beta,", "gamma delta epsilon,", "zeta eta theta", "iota kappa lambda",
                                          "mu."]


def test_cjk_sentences_end_without_spaces() -> None:
    assert split_text("你好。世界很大！我们走吧", 5, chars) == ["你好。", "世界很大！", "我们走吧"]


def test_a_run_with_no_boundary_is_cut_between_characters() -> None:
    assert split_text("abcdefghij", 4, chars) == ["abcd", "efgh", "ij"]


@given(st.text(alphabet=st.sampled_from("ab ,.。\n"), min_size=1, max_size=200), st.integers(1, 12))
def test_pieces_fit_and_together_are_the_text(text: str, budget: int) -> None:
    pieces = split_text(text, budget, chars)
    assert all(0 < len(p) <= budget for p in pieces) or pieces == [text]
    squash = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    assert squash("".join(pieces)) == squash(text)


@pytest.mark.parametrize("budget", [1, 2])
def test_tiny_budgets_still_make_progress(budget: int) -> None:
    assert "".join(split_text("a b c d e", budget, chars)).replace(" ", "") == "abcde"

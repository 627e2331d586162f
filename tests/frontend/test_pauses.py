"""Pause tags cut a text into parts with the seconds of silence between them; bad tags are clear errors."""

from __future__ import annotations

import pytest

from common.request import RequestError
from frontend.pauses import MAX_PAUSES, split_pauses, spoken_form


@pytest.mark.parametrize(("text", "parts", "pauses"), [
    ("No tags here. ", ["No tags here. "], [0.0, 0.0]),  # as given, spaces and all
    ("One. [pause:1.5] Two.", ["One.", "Two."], [0.0, 1.5, 0.0]),
    ("One.[PAUSE: 2s]Two.", ["One.", "Two."], [0.0, 2.0, 0.0]),
    ("[pause:.5] One. [pause:1][pause:0.25] Two. [pause:3]", ["One.", "Two."], [0.5, 1.25, 3.0]),
    ("One [pause:1]   [pause:1] two", ["One", "two"], [0.0, 2.0, 0.0]),  # a blank part between tags adds up
    ("A [pause] without seconds is text.", ["A [pause] without seconds is text."], [0.0, 0.0]),
])
def test_tags_cut_the_text_into_parts_and_pauses(text: str, parts: list[str], pauses: list[float]) -> None:
    assert split_pauses(text) == (parts, pauses)
    again = spoken_form(parts, pauses)  # the transcript: sent back, the same parts and pauses
    assert split_pauses(again) == (parts, pauses)


@pytest.mark.parametrize("tag", ["[pause:]", "[pause:0]", "[pause:-1]", "[pause:10.5]", "[pause:abc]", "[pause:1e3]",
                                 "[pause:nan]", "[pause:inf]"])
def test_a_pause_out_of_range_or_not_a_number_is_an_input_error(tag: str) -> None:
    with pytest.raises(RequestError) as err:
        split_pauses(f"Before {tag} after.")
    assert err.value.param == "input" and "at most 10" in err.value.message


def test_pauses_alone_or_too_many_are_input_errors() -> None:
    with pytest.raises(RequestError, match="nothing to speak besides its pause tags"):
        split_pauses(" [pause:1] [pause:2] ")
    with pytest.raises(RequestError, match=f"more than {MAX_PAUSES} pause tags"):
        split_pauses("a [pause:0.1] " * (MAX_PAUSES + 1))

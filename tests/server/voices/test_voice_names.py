"""Names of created voices: trimmed and NFKC-normalised as stored, compared by Unicode case folding without invisible
characters, a look-alike of a built-in voice seen through its skeleton, and an unknown name's few close matches."""

from __future__ import annotations

import pytest

from frontend.catalog import OPENAI_VOICES
from server.voices import names as voice_names


@pytest.mark.parametrize(("given", "shown"), [
    ("  Ann \t", "Ann"), ("\u200bAnn\u200d", "Ann"), ("ＡＮＮ", "ANN"), ("A\u0308rger", "Ärger"), ("ﬁne", "fine"),
    ("नमस्", "नमस्"),  # a name may end in a combining mark
])
def test_display_trims_and_normalises(given: str, shown: str) -> None:
    assert voice_names.display(given) == shown


def test_keys_fold_case_as_unicode_does_and_drop_invisible_characters() -> None:
    same = ["Ärger", "ärger", "ÄRGER", "A\u0308rger", "Är\u200bger", " ärger  "]
    assert {voice_names.key(n) for n in same} == {"ärger"}
    assert voice_names.key("Straße") == voice_names.key("STRASSE")
    assert voice_names.key("Ann  Lee") == voice_names.key("ann lee")
    assert voice_names.key("Arger") != voice_names.key("Ärger")  # an accent is no case


@pytest.mark.parametrize("name", ["", " ", "\u200b\u200c\u200d\u2060\ufeff", "\u3164", "\u2800", "\u0301",
                                  "\u00a0\u3000", "\ufe0f", "\U000e0041"])
def test_names_without_a_visible_character(name: str) -> None:
    assert not voice_names.visible(voice_names.display(name))


@pytest.mark.parametrize("name", ["alloy", "ALLOY", "ａｌｌｏｙ", "\u0430ll\u043ey", "\u0391lloy", "al\u200bloy",
                                  "alloy\ufe0f",
                                  # Armenian o; capital I, digit one, U+01C0 for l; accents, combining or precomposed
                                  "all\u0585y", "aIIoy", "a11oy", "a\u01c0\u01c0oy", "all\u1ecdy", "allo\u0323y",
                                  "allo\u00fd", "allo\u0301y"])
def test_look_alikes_of_a_built_in_voice_share_its_skeleton(name: str) -> None:
    assert voice_names.skeleton(name) == voice_names.skeleton("alloy")


def test_a_skeleton_still_folds_case_and_reads_the_id_prefix() -> None:
    assert voice_names.skeleton("VIVIAN") == voice_names.skeleton("Vivian")  # capital I read as l, and small i too
    assert voice_names.skeleton("v\u043eice_abc").startswith(voice_names.skeleton("voice_"))  # a Cyrillic o


@pytest.mark.parametrize(("name", "control"), [("ab\u0000c", True), ("ab\ncd", True), ("a\tb", True),
                                               ("a\u0085b", True), ("\x1b[31mred", True), ("red\x07", True),
                                               ("a\u2028b", True), ("a\u2029b", True), ("\U000f0000", True),
                                               ("a b", False), ("Ärger", False)])
def test_control_characters_in_a_name_are_seen(name: str, control: bool) -> None:
    assert voice_names.has_control(name) is control


def test_other_scripts_keep_their_names() -> None:
    assert voice_names.key("Сергей") != voice_names.key("Cepгeй")
    assert all(voice_names.skeleton("Сергей") != voice_names.skeleton(b) for b in OPENAI_VOICES)


def test_close_matches_are_few() -> None:
    names = [f"Voice number {i}" for i in range(1000)]
    assert voice_names.close("voice numbr 7", names)[0] == "Voice number 7"
    assert len(voice_names.close("Voice number", names)) == voice_names.MAX_CANDIDATES
    assert voice_names.close("nobody", ["alloy", "echo"]) == []
    assert voice_names.close("x" * 100_000, names) == []  # a long name is compared by its start

"""Language detection names only the checkpoint's own languages, and none where it is unsure."""

from __future__ import annotations

import pytest

from frontend.language import LanguageDetector

ALL = ["chinese", "english", "japanese", "korean", "german", "french", "russian", "portuguese", "spanish", "italian",
       "sichuan_dialect"]


@pytest.mark.parametrize(("text", "want"), [
    ("The weather is lovely today, and we are going for a walk.", "english"),
    ("今天天气很好，我们去散步吧。", "chinese"),
    ("今日はいい天気ですね。散歩に行きましょう。", "japanese"),
    ("오늘 날씨가 정말 좋네요. 산책하러 갑시다.", "korean"),
    ("Das Wetter ist heute schön, wir gehen spazieren.", "german"),
    ("Il fait beau aujourd'hui, nous allons nous promener.", "french"),
    ("Сегодня прекрасная погода, мы идём гулять.", "russian"),
    ("Hoy hace muy buen tiempo y vamos a dar un paseo.", "spanish"),
    ("Oggi il tempo è bellissimo e andiamo a fare una passeggiata.", "italian"),
    ("Hoje o tempo está ótimo e nós vamos dar um passeio.", "portuguese"),
    ("12345 678", None),  # nothing to tell by: the model's default stays
])
def test_each_language_of_a_full_checkpoint(text: str, want: str | None) -> None:
    assert LanguageDetector(ALL).detect(text) == want


def test_only_the_checkpoints_languages_are_named() -> None:
    two = LanguageDetector(["english", "chinese"])
    assert two.languages == ["chinese", "english"]
    assert two.detect("今天天气很好。") == "chinese" and two.detect("Good morning to you all.") == "english"
    assert two.detect("Das Wetter ist heute schön, wir gehen spazieren.") in ("english", None)  # never german


def test_a_checkpoint_with_one_language_names_none() -> None:
    one = LanguageDetector(["english", "sichuan_dialect"])
    assert one.languages == ["english"] and one.detect("Good morning to you all.") is None

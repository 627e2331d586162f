"""Which of a checkpoint's languages a text is in, for requests that leave `language` out (or say "auto"): the model
then speaks each segment as if its language had been named (the same prompt, so the same audio). Lingua
(lingua-language-detector) decides among the checkpoint's own languages only; where it is unsure (a short or mixed
text: the best language is not ahead of the next by `MIN_RELATIVE_DISTANCE`), nothing is named and the model's
own default stays, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from lingua import Language, LanguageDetectorBuilder

# Qwen3-TTS's language names (config.json's `codec_language_id`) → Lingua's; dialects are chosen by the speaker
LINGUA = {"chinese": Language.CHINESE, "english": Language.ENGLISH, "japanese": Language.JAPANESE,
          "korean": Language.KOREAN, "german": Language.GERMAN, "french": Language.FRENCH,
          "russian": Language.RUSSIAN, "portuguese": Language.PORTUGUESE, "spanish": Language.SPANISH,
          "italian": Language.ITALIAN}
MIN_RELATIVE_DISTANCE = 0.1  # Lingua's margin between the best two languages below which it answers none
SAMPLE_CHARS = 400  # of a segment: enough to tell, and a bounded cost on the event loop (~0.3 ms)


class LanguageDetector:
    """Detects among `languages` (a checkpoint's names). With fewer than two it can tell apart, it names none."""

    def __init__(self, languages: Iterable[str]) -> None:
        self._names = {LINGUA[name]: name for name in languages if name in LINGUA}
        self._lingua = None
        if len(self._names) >= 2:
            self._lingua = (LanguageDetectorBuilder.from_languages(*self._names)
                            .with_minimum_relative_distance(MIN_RELATIVE_DISTANCE)
                            .with_preloaded_language_models().build())

    @property
    def languages(self) -> list[str]:
        return sorted(self._names.values())

    def detect(self, text: str) -> str | None:
        """The checkpoint's name for `text`'s language; None when unsure."""
        if self._lingua is None:
            return None
        found = self._lingua.detect_language_of(text[:SAMPLE_CHARS])
        return self._names.get(found) if found is not None else None

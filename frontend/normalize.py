"""Text normalisation: a text as it is read aloud, before it is tokenized. "$3.50 at 7:30 pm" reaches the model
as "three dollars fifty cents at seven thirty p m"; "价格是3.5元" as "价格是三点五元".

Chinese and Japanese go through WeTextProcessing's normalisation grammars (its runtime, `wetext`: prebuilt FSTs,
no compiler), the languages written in letters and Korean through frontend/number_words.py (num2words). A
text in another language, or whose language is not known, is left as it is. On by default; a request's
`normalize: false` turns it off. What it gave is the response's transcript: sent back as input, it is spoken the
same (normalising it again changes nothing).
"""

from __future__ import annotations

import threading

from wetext import Normalizer as WeText

from frontend.number_words import LANG_CODES, Rules

WETEXT = {"chinese": "zh", "japanese": "ja"}
LANGUAGES = sorted({*WETEXT, *LANG_CODES})


class TextNormalizer:
    """Per language, built on first use (WeTextProcessing's grammars take a moment to load). Thread-safe: requests
    are prepared on the event loop and, when long, in worker threads."""

    def __init__(self) -> None:
        self._by_language: dict[str, Rules | WeText] = {}
        self._lock = threading.Lock()

    def normalize(self, text: str, language: str | None) -> str:
        if language is None or language not in LANGUAGES or not worth_normalizing(text):
            return text
        return self._for(language).normalize(text) if language in WETEXT else self._rules(language).apply(text)

    def _for(self, language: str) -> WeText:
        found = self._get(language)
        assert isinstance(found, WeText)
        return found

    def _rules(self, language: str) -> Rules:
        found = self._get(language)
        assert isinstance(found, Rules)
        return found

    def _get(self, language: str) -> Rules | WeText:
        found = self._by_language.get(language)
        if found is None:
            with self._lock:
                found = self._by_language.get(language)
                if found is None:
                    found = (WeText(lang=WETEXT[language], operator="tn") if language in WETEXT
                             else Rules(language))
                    self._by_language[language] = found
        return found


def worth_normalizing(text: str) -> bool:
    """Only a text with a digit or a symbol the rules read has anything to normalise (most texts: skipped fast)."""
    return any(c.isdigit() or c in "$€£₩%&." for c in text)

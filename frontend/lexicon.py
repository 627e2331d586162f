"""Respellings: a user's lexicon of words the model says wrong (names, brands), each mapped to a spelling it says
right. `serve --lexicon FILE` (TALKSTREAM_LEXICON) loads a JSON object `{"word": "respelling", ...}`; SIGHUP loads
it again. A respelling replaces whole words only, matched without regard to case in any script ("ÉLAN" matches
"élan"), where no letter, digit or underscore of any script touches either end; the longest entry wins where two
overlap. It runs before normalisation, so a respelling may hold digits or symbols to be read out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

MAX_ENTRIES = 100_000
MAX_BYTES = 16 << 20


class LexiconError(ValueError):
    """A lexicon file that cannot be used, with what is wrong in it."""


class Lexicon:
    def __init__(self, entries: dict[str, str], source: Path | None = None) -> None:
        self.source = source
        self._by_fold = {word.casefold(): spelling for word, spelling in entries.items()}
        # longest first: an alternation takes its first match, so "New York City" beats "New York"
        words = sorted(entries, key=len, reverse=True)
        body = "|".join(re.escape(w) for w in words)
        self._pattern = re.compile(rf"(?<!\w)(?:{body})(?!\w)", re.IGNORECASE) if words else None

    def __len__(self) -> int:
        return len(self._by_fold)

    def apply(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(self._respell, text)

    def _respell(self, match: re.Match[str]) -> str:
        return self._by_fold.get(match.group(0).casefold(), match.group(0))

    @classmethod
    def load(cls, path: Path) -> Lexicon:
        """Reads and checks `path`; a LexiconError says what is wrong (the file as a whole is refused)."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise LexiconError(f"cannot read the lexicon {path}: {exc.strerror or exc}") from None
        if len(raw) > MAX_BYTES:
            raise LexiconError(f"the lexicon {path} is over {MAX_BYTES >> 20} MiB")
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LexiconError(f"the lexicon {path} is not UTF-8 JSON: {exc}") from None
        if not isinstance(data, dict):
            raise LexiconError(f"the lexicon {path} must be a JSON object of word → respelling")
        if len(data) > MAX_ENTRIES:
            raise LexiconError(f"the lexicon {path} has {len(data)} entries; at most {MAX_ENTRIES} are accepted")
        for word, spelling in data.items():
            if not isinstance(spelling, str) or not word.strip() or not spelling.strip():
                raise LexiconError(f"the lexicon {path}: entry {word!r} must map a word to a non-empty string")
            if word != word.strip():
                raise LexiconError(f"the lexicon {path}: entry {word!r} has spaces around it")
        folded: dict[str, str] = {}
        for word in data:
            if (other := folded.setdefault(word.casefold(), word)) != word:
                raise LexiconError(f"the lexicon {path}: {other!r} and {word!r} are the same word")
        return cls(data, path)

"""Names of created voices and consents: what is stored (`display`), what is compared (`key`), what a built-in voice
must not look like (`skeleton`), and the few names an unknown one may have meant (`close`).

A name is trimmed and NFKC-normalised (fullwidth letters become ASCII, ligatures letters); two names are one when
their keys are equal: Unicode case folding (`Ärger` is `ärger`, which SQLite's NOCASE, ASCII only, does not see),
with invisible characters (zero-width spaces and joiners, other format characters) left out and runs of spaces made
one. A name needs a visible character.

Look-alikes: a created voice may not pass for a built-in one. Its skeleton must differ from every built-in's: its
key without accents (combining marks dropped after NFD: `alloý` is `alloy`), with a small table of confusables read
as the Latin letters they look like (common Cyrillic, Greek and Armenian homoglyphs; i, I, digit 1, `|` and U+01C0
`ǀ` all read as `l`; digit 0 as `o`). It is a short documented table, not Unicode's whole confusables file.
Only built-in names (and the `voice_` prefix of ids) are guarded this way: created names in other scripts are
compared by key alone, so `Сергей` and `Cepreй` may both exist. A name with a control character in it is refused
(`has_control`).
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable

MAX_CANDIDATES = 3
MATCH_CHARS = 64  # of an unknown name, compared for close matches: difflib's cost grows with the square
_CUTOFF = 0.6
_TRIMMED_CATEGORIES = {"Cc", "Cf", "Zs", "Zl", "Zp"}
_MARKS = {"Mn", "Me"}  # visible on a letter, not alone
# letters and symbols that draw nothing: the Hangul fillers, the Braille blank, the combining grapheme joiner
_BLANKS = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f")
_DROPPED = frozenset({"Cc", "Cf"})  # left out of a key, with the blanks and variation selectors
_HOMOGLYPHS = str.maketrans(
    # Cyrillic
    "аАвВеЕкКмМнНоОрРсСтТуУхХіІјЈѕЅԁԛԜԝһҺӏӀѵѴүҮɡɑı"
    # Greek
    "αΑβΒεΕζΖηΗιΙκΚμΜνΝοΟρΡτΤυΥχΧγ"
    # Armenian
    "օՕոսՍհցզՏԼ"
    # the l class (Latin capital I, digit one, vertical line, dental click U+01C0) and digit zero
    "I1|ǀ0",
    "aAbBeEkKmMhHoOpPcCtTyYxXiljJsSdqWwhHllvVyYgai"
    "aAbBeEzZnHilkKuMvNoOpPtTuYxXy"
    "oOnuUhgqSL"
    "llllo",
)


def display(name: str) -> str:
    """The name as stored and shown: NFKC, without the blank or invisible characters at either end."""
    name = unicodedata.normalize("NFKC", name)
    start, end = 0, len(name)
    while start < end and _trimmed(name[start]):
        start += 1
    while end > start and _trimmed(name[end - 1]):
        end -= 1
    return name[start:end]


def visible(name: str) -> bool:
    return not all(_invisible(c) for c in name)


def key(name: str) -> str:
    """What two names are compared by: equal keys, one name."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    kept = "".join(" " if c.isspace() else c for c in folded if not _dropped(c))
    return " ".join(kept.split())


def skeleton(name: str) -> str:
    """The key of the name without accents and with look-alike letters read as the Latin ones they look like."""
    bare = "".join(c for c in unicodedata.normalize("NFD", unicodedata.normalize("NFKC", name))
                   if unicodedata.category(c) != "Mn")
    return key(bare.translate(_HOMOGLYPHS)).replace("i", "l")  # after folding, so that `VIVIAN` is still `Vivian`


# Control characters, line and paragraph separators (a line break to whatever shows the name), private use
_CONTROL = frozenset({"Cc", "Zl", "Zp", "Co"})


def has_control(name: str) -> bool:
    """Whether a control character (a NUL, an escape, a newline, a tab, U+2028...) or a private-use one is in it."""
    return any(unicodedata.category(c) in _CONTROL for c in name)


def close(name: str, names: Iterable[str]) -> list[str]:
    """At most MAX_CANDIDATES of `names` that `name` may have meant, best first."""
    by_key: dict[str, str] = {}
    for n in names:
        by_key.setdefault(key(n)[:MATCH_CHARS], n)
    found = difflib.get_close_matches(key(name)[:MATCH_CHARS], by_key, MAX_CANDIDATES, _CUTOFF)
    return [by_key[k] for k in found]


def _trimmed(c: str) -> bool:
    return c in _BLANKS or c.isspace() or _variation_selector(c) or unicodedata.category(c) in _TRIMMED_CATEGORIES


def _invisible(c: str) -> bool:
    return _trimmed(c) or unicodedata.category(c) in _MARKS


def _dropped(c: str) -> bool:
    return c in _BLANKS or _variation_selector(c) or unicodedata.category(c) in _DROPPED


def _variation_selector(c: str) -> bool:
    return "\ufe00" <= c <= "\ufe0f" or "\U000e0100" <= c <= "\U000e01ef"

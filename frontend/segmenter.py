"""Splitting a text whose speech would not fit one generation into pieces that are spoken one after another.

A piece ends at a sentence boundary where it can, else at a clause boundary, else between words, else between
characters (a long run of text without any of them). Pieces are packed greedily: each holds as many whole sentences
(clauses, words) as fit its token budget. The pieces, stripped of the spaces around them, are the text (a text that
fits is returned as it is).

It runs on the event loop, so its cost stays linear in the text: each unit is tokenized once and a piece's count is
the sum of its units' (checked once per piece: a piece that the sum underestimated is split again), and a run with
no boundary is cut where its first `budget` tokens end (`cut`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

# each pattern matches the gap after which a piece may end; the gap stays with the piece before it
_SENTENCE = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+|(?<=[。！？；])|\n+")
_CLAUSE = re.compile(r"(?<=[,;:，；：、])\s*|\s+(?=[—–-]\s)")
_WORD = re.compile(r"\s+")
_LEVELS = (_SENTENCE, _CLAUSE, _WORD)


def split_text(text: str, budget: int, count: Callable[[str], int],
               cut: Callable[[str, int], int] | None = None) -> list[str]:
    """Pieces of `text` of at most `budget` tokens each (as `count` measures them), at the best boundaries.
    `cut(text, n)`: where (a character index) the first n tokens of `text` end; by bisection when not given."""
    if count(text) <= budget:  # one piece, exactly as given (its spaces are tokens too)
        return [text]
    cutter = cut or (lambda t, n: _bisect(t, n, count))
    pieces = [p.strip() for p in _split(text, 0, budget, count, cutter)]
    return [p for p in pieces if p]


def _split(text: str, level: int, budget: int, count: Callable[[str], int],
           cut: Callable[[str, int], int]) -> list[str]:
    if count(text.strip()) <= budget:
        return [text]
    if level == len(_LEVELS):
        return _characters(text, budget, count, cut)
    units = _units(text, _LEVELS[level])
    if len(units) == 1:
        return _split(text, level + 1, budget, count, cut)
    pieces: list[str] = []
    for packed in _pack(units, budget, count):
        if count("".join(packed).strip()) <= budget:
            pieces.append("".join(packed))
        else:  # one unit too long, or the sum of the units' counts was short: split it again, finer
            pieces.extend(_split("".join(packed), level + 1, budget, count, cut))
    return pieces


def _pack(units: list[str], budget: int, count: Callable[[str], int]) -> list[list[str]]:
    """Consecutive units, as many per group as their token counts' sum allows (an oversized unit alone)."""
    groups: list[list[str]] = []
    current: list[str] = []
    total = 0
    for unit in units:
        n = count(unit.strip())
        if current and total + n > budget:
            groups.append(current)
            current, total = [], 0
        current.append(unit)
        total += n
    if current:
        groups.append(current)
    return groups


def _units(text: str, boundary: re.Pattern[str]) -> list[str]:
    """`text` cut after each boundary match; the units concatenate to `text`."""
    units, start = [], 0
    for match in boundary.finditer(text):
        if match.end() > start:
            units.append(text[start : match.end()])
            start = match.end()
    if start < len(text):
        units.append(text[start:])
    return units


def _characters(text: str, budget: int, count: Callable[[str], int], cut: Callable[[str, int], int]) -> list[str]:
    pieces = []
    while text:
        end = max(1, _cut_prefix(text, budget, cut))
        while end > 1 and count(text[:end].strip()) > budget:  # a cut inside a character's bytes: step back
            end -= 1
        pieces.append(text[:end])
        text = text[end:]
    return pieces


def _cut_prefix(text: str, budget: int, cut: Callable[[str, int], int]) -> int:
    """`cut` on a prefix just long enough to hold `budget` tokens (grown as needed), so each piece costs about its
    own length, not the rest of the text's."""
    size = budget
    while True:
        end = cut(text[:size], budget)
        if end < min(size, len(text)) or size >= len(text):
            return end
        size *= 4


def _bisect(text: str, budget: int, count: Callable[[str], int]) -> int:
    """The longest prefix that fits (at least one character)."""
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:mid].strip()) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo

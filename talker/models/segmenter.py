"""Splitting a text whose speech would not fit one generation into pieces that are spoken one after another.

A piece ends at a sentence boundary where it can, else at a clause boundary, else between words, else between
characters (a long run of text without any of them). Pieces are packed greedily: each holds as many whole sentences
(clauses, words) as fit its token budget. The pieces, stripped of the spaces around them, are the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# each pattern matches the gap after which a piece may end; the gap stays with the piece before it
_SENTENCE = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+|(?<=[。！？；])|\n+")
_CLAUSE = re.compile(r"(?<=[,;:，；：、])\s*|\s+(?=[—–-]\s)")
_WORD = re.compile(r"\s+")
_LEVELS = (_SENTENCE, _CLAUSE, _WORD)


def split_text(text: str, budget: int, count: Callable[[str], int]) -> list[str]:
    """Pieces of `text` of at most `budget` tokens each (as `count` measures them), at the best boundaries."""
    pieces = [p.strip() for p in _split(text, 0, budget, count)]
    return [p for p in pieces if p]


def _split(text: str, level: int, budget: int, count: Callable[[str], int]) -> list[str]:
    if count(text.strip()) <= budget:
        return [text]
    if level == len(_LEVELS):
        return _characters(text, budget, count)
    units = _units(text, _LEVELS[level])
    if len(units) == 1:
        return _split(text, level + 1, budget, count)
    pieces: list[str] = []
    current = ""
    for unit in units:
        if count((current + unit).strip()) <= budget:
            current += unit
            continue
        if current:
            pieces.append(current)
        current = ""
        if count(unit.strip()) <= budget:
            current = unit
        else:
            pieces.extend(_split(unit, level + 1, budget, count))
    if current:
        pieces.append(current)
    return pieces


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


def _characters(text: str, budget: int, count: Callable[[str], int]) -> list[str]:
    """The longest prefixes that fit, found by bisection (at least one character each)."""
    pieces = []
    while text:
        lo, hi = 1, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[:mid].strip()) <= budget:
                lo = mid
            else:
                hi = mid - 1
        pieces.append(text[:lo])
        text = text[lo:]
    return pieces

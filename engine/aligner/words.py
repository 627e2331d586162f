"""The aligner's words: a transcript cut into the units it times, and the repair of the times it predicts.

Both follow the official `qwen-asr` package (`Qwen3ForceAlignProcessor`), whose outputs the tests compare against:

- Whitespace-separated tokens lose every character that is not a letter, a digit or an apostrophe (so "3.14" is
  "314" and "co-op" "coop": punctuation inside a token is deleted, not split on); each CJK ideograph is a word of
  its own. Japanese is cut by nagisa's tagger, where it is installed; Korean after each token's longest head on the
  official word list (`korean`), its Hanja left whole.
- The model predicts one time class per `<timestamp>` slot, two per word (start, end), not always in order. The
  longest non-decreasing run of slots is kept; a gap of one or two slots takes its nearer kept neighbour (the left
  one on a tie), a longer gap is filled on the straight line between its neighbours; times are whole milliseconds,
  truncated.
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.aligner.korean import split_korean


@dataclass(frozen=True, slots=True)
class Clip:
    pcm: np.ndarray  # [S] int16 or float mono
    rate: int
    text: str  # the transcript
    language: str | None = None  # its language's name (e.g. "english"): picks the word splitter


@dataclass(frozen=True, slots=True)
class Word:
    word: str
    start: float  # seconds from the clip's start
    end: float


# CJK Unified Ideographs and extensions A-E, and the compatibility ideographs
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0xF900, 0xFAFF))


def is_cjk(ch: str) -> bool:
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _CJK)


def _kept(ch: str) -> bool:
    return ch == "'" or unicodedata.category(ch)[0] in "LN"


def _clean(token: str) -> str:
    return "".join(ch for ch in token if _kept(ch))


def split_words(text: str, language: str | None, korean: frozenset[str] = frozenset()) -> list[str]:
    """The units the aligner times, in order (`korean`: the official Korean word list, for Korean texts)."""
    lang = (language or "").lower()
    if lang == "japanese":
        return _japanese(text)
    if lang == "korean":
        return [w for w in map(_clean, split_korean(text, korean)) if w]
    words: list[str] = []
    for token in text.split():
        run = ""
        for ch in _clean(token):
            if is_cjk(ch):
                if run:
                    words.append(run)
                words.append(ch)
                run = ""
            else:
                run += ch
        if run:
            words.append(run)
    return words


def _japanese(text: str) -> list[str]:
    tagger = _nagisa()
    if tagger is None:  # no tagger: a Japanese text is cut as a CJK one
        return split_words(text, None)
    return [w for w in (_clean(word) for word in tagger.tagging(text).words) if w]


_TAGGER: list[Any] = []  # nagisa once imported (None: not installed)


def _nagisa() -> Any:
    """nagisa, imported on a thread of its own: its native library is built with -ffast-math, and loading it turns
    on flush-to-zero for the thread that loads it and the threads that thread starts later. On the caller's thread
    that would change float results (the aligner's after its first Japanese text; hypothesis refuses to run)."""
    if not _TAGGER:
        def load() -> None:
            try:
                import nagisa  # type: ignore[import-not-found,import-untyped,unused-ignore]
            except ImportError:
                nagisa = None
            _TAGGER.append(nagisa)

        thread = threading.Thread(target=load, name="nagisa-import")
        thread.start()
        thread.join()
    return _TAGGER[0]


def repair(times: Sequence[float]) -> list[int]:
    """Predicted times (ms, two per word) → a non-decreasing sequence of whole milliseconds."""
    n = len(times)
    if n == 0:
        return []
    kept = _longest_run(times)
    out = list(times)
    i = 0
    while i < n:
        if kept[i]:
            i += 1
            continue
        j = i
        while j < n and not kept[j]:
            j += 1
        left = next((out[k] for k in range(i - 1, -1, -1) if kept[k]), None)
        right = next((times[k] for k in range(j, n) if kept[k]), None)
        for k in range(i, j):
            out[k] = _fill(k, i, j, left, right)
        i = j
    return [int(t) for t in out]


def _fill(k: int, i: int, j: int, left: float | None, right: float | None) -> float:
    """Slot k of the gap [i, j) between kept times `left` (slot i-1) and `right` (slot j)."""
    if left is None or right is None:
        value = left if right is None else right
        return value if value is not None else 0.0
    if j - i <= 2:
        return left if k - i + 1 <= j - k else right
    return left + (right - left) / (j - i + 1) * (k - i + 1)


def _longest_run(times: Sequence[float]) -> list[bool]:
    """Marks the slots of the longest non-decreasing subsequence (the first found, as the official O(n²) search
    finds it: each slot extends the earliest predecessor that gives it its best length)."""
    n = len(times)
    best, parent = [1] * n, [-1] * n
    for i in range(1, n):
        for j in range(i):
            if times[j] <= times[i] and best[j] + 1 > best[i]:
                best[i], parent[i] = best[j] + 1, j
    kept = [False] * n
    k = best.index(max(best))
    while k != -1:
        kept[k] = True
        k = parent[k]
    return kept

"""Pause tags: `[pause:1.5]` (seconds; `[pause:1.5s]` and any case too) in a text asks for that much silence between
the words around it. The text is cut at its tags into parts, each spoken as segments are (one codec stream across
them all), with exact digital silence spliced in between (output_builder/assembler.py).
"""

from __future__ import annotations

import math
import re

from common.request import RequestError

MAX_PAUSE_S = 10.0  # one tag's silence at most
MAX_PAUSES = 100  # tags in one text
_TAG = re.compile(r"\[\s*pause\s*:\s*([^\]\[]*?)\s*\]", re.IGNORECASE)
_SECONDS = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*s?", re.IGNORECASE)


def split_pauses(text: str) -> tuple[list[str], list[float]]:
    """The text's parts (stripped, none blank) and the seconds of silence before each part, then after the last:
    `len(pauses) == len(parts) + 1`. Adjacent tags add up. A text without tags is one part, exactly as given (its
    spaces are tokens too), with no pauses."""
    if _TAG.search(text) is None:
        return [text], [0.0, 0.0]
    parts: list[str] = []
    pauses = [0.0]
    start = 0
    for tags, match in enumerate(_TAG.finditer(text), 1):
        if tags > MAX_PAUSES:
            raise RequestError(f"input has more than {MAX_PAUSES} pause tags", param="input")
        _add(text[start : match.start()], parts, pauses)
        pauses[-1] += _seconds(match)
        start = match.end()
    _add(text[start:], parts, pauses)
    if not parts:
        raise RequestError("input has nothing to speak besides its pause tags", param="input")
    return parts, pauses


def spoken_form(parts: list[str], pauses: list[float]) -> str:
    """The parts with their pauses as tags again: sent as input, it is cut into the same parts and pauses."""
    words: list[str] = []
    for part, before in zip(parts, pauses, strict=False):
        if before:
            words.append(f"[pause:{before:g}]")
        words.append(part)
    if pauses[-1]:
        words.append(f"[pause:{pauses[-1]:g}]")
    return " ".join(words)


def _add(piece: str, parts: list[str], pauses: list[float]) -> None:
    if piece.strip():
        parts.append(piece.strip())
        pauses.append(0.0)


def _seconds(tag: re.Match[str]) -> float:
    value = _SECONDS.fullmatch(tag.group(1))
    seconds = float(value.group(1)) if value else math.nan
    if not 0.0 < seconds <= MAX_PAUSE_S:
        raise RequestError(f"a pause tag takes seconds, more than 0 and at most {MAX_PAUSE_S:g}, as in "
                           f"[pause:1.5]; not {tag.group(0)}", param="input")
    return seconds

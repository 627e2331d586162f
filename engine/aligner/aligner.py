"""The forced aligner as a whole: clips and their transcripts in, each word's start and end out.

1. Each clip to 16 kHz and log-mel features (`audio`), each transcript to words (`words`, `korean`).
2. The prompt: `<|audio_start|>`, one `<|audio_pad|>` per audio token, `<|audio_end|>`, then each word followed by
   two `<timestamp>` tokens (the words tokenized as one text, as the official processor does).
3. The audio encoder per clip (as the official package runs it), one decoder pass for all clips at once (left-padded).
4. Each word's two classes × 80 ms, repaired into order (`words.repair`), in seconds rounded to 3 decimals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer

from engine.aligner.audio import Features, to_16k
from engine.aligner.model import ForcedAligner, audio_tokens
from engine.aligner.words import Clip, Word, repair, split_words

STAMPS = "<timestamp><timestamp>"


class Aligner:
    def __init__(self, directory: Path, korean: Callable[[], frozenset[str]] = frozenset, device: str = "cpu") -> None:
        """`korean`: gives the official Korean word list's words (`korean.KoreanWordlist`), asked only when a Korean
        text is aligned; without them Korean tokens stay whole."""
        self.korean, self.device = korean, torch.device(device)
        self.model = ForcedAligner.load(directory).to_device(self.device)
        self.features = Features(directory)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self.cfg = self.model.cfg

    @property
    def languages(self) -> tuple[str, ...]:
        return self.cfg.languages

    def align(self, clips: list[Clip]) -> list[list[Word]]:
        """Each clip's words with their times (a clip with no words: none)."""
        korean = self.korean() if any((c.language or "").lower() == "korean" for c in clips) else frozenset()
        wordlists = [split_words(c.text, c.language, korean) for c in clips]
        todo = [i for i, words in enumerate(wordlists) if words]
        out: list[list[Word]] = [[] for _ in clips]
        if not todo:
            return out
        audio, ids = [], []
        # off the CPU, what the model makes it makes on its device (a mode that costs every op a Python call)
        on_device = torch.device(self.device) if self.device.type != "cpu" else contextlib.nullcontext()
        with on_device, torch.inference_mode():
            for i in todo:
                feats = self.features(to_16k(clips[i].pcm, clips[i].rate))  # [M, F]
                audio.append(self.model.audio_tower(torch.from_numpy(feats).float().to(self.device)))  # [T, H]
                ids.append(self.prompt(wordlists[i], audio_tokens(feats.shape[1])))
            found = self.model.classes(ids, audio)
        for i, classes in zip(todo, found, strict=True):
            ms = repair((classes.double() * self.cfg.segment_ms).tolist())
            out[i] = [Word(w, round(ms[2 * k] / 1000, 3), round(ms[2 * k + 1] / 1000, 3))
                      for k, w in enumerate(wordlists[i])]
        return out

    def prompt(self, words: list[str], tokens: int) -> list[int]:
        text: list[int] = self.tokenizer(STAMPS.join(words) + STAMPS, add_special_tokens=False)["input_ids"]
        return [self.cfg.audio_start, *[self.cfg.audio_pad] * tokens, self.cfg.audio_end, *text]

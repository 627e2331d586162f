"""Request validation and tokenization on the event loop, before any engine work. Imports no torch."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from talker.models.qwen3_tts.config import CheckpointError, GenerationDefaults, Qwen3TTSConfig
from talker.models.qwen3_tts.prompt import PromptIds, assistant_text, codec_prefix, instruct_text
from talker.request import RequestError, SamplingParams, SpeechRequest

OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse", "marin", "cedar",
)
MAX_INPUT_CHARS = 4096


def load_tokenizer(directory: Path) -> Tokenizer:
    """The checkpoint's Qwen2 BPE tokenizer: tokenizer.json, or vocab.json + merges.txt."""
    tj = directory / "tokenizer.json"
    if tj.is_file():
        return Tokenizer.from_file(str(tj))
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    for f in (vocab, merges):
        if not f.is_file():
            raise CheckpointError(f"missing checkpoint file: {f} (and no tokenizer.json)")
    tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    cfg_path = directory / "tokenizer_config.json"
    if cfg_path.is_file():
        added = json.loads(cfg_path.read_text()).get("added_tokens_decoder", {})
        tok.add_special_tokens([AddedToken(v["content"], special=True) for _, v in sorted(added.items())])
    return tok


@dataclass(frozen=True, slots=True)
class Voice:
    name: str
    speaker: str | None  # the checkpoint speaker it maps onto
    alias_of: str | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated request, ready for the worker."""

    request: SpeechRequest
    prompt: PromptIds
    params: SamplingParams
    seed: int
    max_frames: int


class Frontend:
    def __init__(
        self, cfg: Qwen3TTSConfig, gen: GenerationDefaults, tokenizer: Tokenizer,
        max_frames: int, text_width: int, max_prompt: int,
    ) -> None:
        self.cfg, self.gen, self.tokenizer = cfg, gen, tokenizer
        self.max_frames, self.text_width, self.max_prompt = max_frames, text_width, max_prompt
        self.voices = build_voices(cfg)

    @property
    def default_voice(self) -> str | None:
        speakers = sorted(self.cfg.speakers)
        return speakers[0] if speakers else None

    def prepare(self, req: SpeechRequest) -> Prepared:
        text = req.text
        if not text or not text.strip():
            raise RequestError("input must not be empty", param="input")
        if len(text) > MAX_INPUT_CHARS:
            raise RequestError(f"input is longer than {MAX_INPUT_CHARS} characters", param="input")
        speaker = self.speaker_for(req.voice)
        instruct = self._instruct_ids(req.instructions)
        ids = tuple(self.tokenizer.encode(assistant_text(text), add_special_tokens=False).ids)
        prompt = PromptIds(
            ids, instruct, codec_prefix(self.cfg, req.language, speaker), not self.gen.non_streaming_mode
        )
        if len(prompt.text) + 1 > self.text_width:
            raise RequestError(f"input is too long ({len(prompt.text)} tokens)", param="input")
        if len(ids) + len(prompt.codec_prefix) + len(instruct or ()) > self.max_prompt:
            raise RequestError("input and instructions are too long for this model", param="input")
        params = self.sampling(req)
        max_frames = self.max_frames if req.max_frames is None else req.max_frames
        if not 1 <= max_frames <= self.max_frames:
            raise RequestError(f"max_frames must be between 1 and {self.max_frames}", param="max_frames")
        seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(4), "little")
        if not 0 <= seed < 2**63:
            raise RequestError("seed must be a non-negative 63-bit integer", param="seed")
        return Prepared(req, prompt, params, seed & 0x7FFFFFFF, max_frames)

    def speaker_for(self, voice: str | None) -> str | None:
        name = (voice or self.default_voice or "").lower()
        if not name and not self.voices:
            return None
        found = self.voices.get(name)
        if found is None:
            names = ", ".join(sorted(self.voices))
            raise RequestError(f"unknown voice '{voice}'; available voices: {names}", param="voice")
        return found.speaker

    def _instruct_ids(self, instructions: str | None) -> tuple[int, ...] | None:
        if not instructions:
            return None
        if self.cfg.model_size.lower() in ("0b6", "0.6b"):
            return None  # the 0.6B CustomVoice model takes no instruction, as in the official package
        return tuple(self.tokenizer.encode(instruct_text(instructions), add_special_tokens=False).ids)

    def sampling(self, req: SpeechRequest) -> SamplingParams:
        g = self.gen
        temperature = req.temperature if req.temperature is not None else (g.temperature if g.do_sample else 0.0)
        params = SamplingParams(
            temperature=temperature,
            top_k=req.top_k if req.top_k is not None else g.top_k,
            top_p=req.top_p if req.top_p is not None else g.top_p,
            repetition_penalty=req.repetition_penalty if req.repetition_penalty is not None else g.repetition_penalty,
            subtalker_temperature=g.subtalker_temperature if g.subtalker_dosample else 0.0,
            subtalker_top_k=g.subtalker_top_k,
            subtalker_top_p=g.subtalker_top_p,
        )
        params.validate()
        return params


def build_voices(cfg: Qwen3TTSConfig) -> dict[str, Voice]:
    """The checkpoint's speakers, plus OpenAI's voice names mapped onto them in turn."""
    speakers = sorted(cfg.speakers)
    voices = {s: Voice(s, s) for s in speakers}
    for i, name in enumerate(OPENAI_VOICES):
        if name not in voices:
            target = speakers[i % len(speakers)] if speakers else None
            voices[name] = Voice(name, target, alias_of=target)
    return voices

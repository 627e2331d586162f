"""Prompt construction for Qwen3-TTS, following the official package's layout.

Both of the official text modes are supported:
- full text (the official `generate_custom_voice` default, `non_streaming_mode=True`): the prompt holds the whole
  text, each token summed with codec pad; every frame is then fed `tts_pad`.
- streaming text: the prompt holds only the first text token; the rest is fed one token per frame ("trailing
  text"), then `tts_eos`, then `tts_pad` forever.

A cloned voice (Base checkpoints) puts the reference's x-vector where a speaker's codec id would go. In-context
cloning then replaces the first text token with the reference: its transcript followed by the text, against
`codec_bos` and the reference's frames (the sum of each frame's codebook embeddings). Full text: all words over
`codec_pad`, then the frames over `tts_pad`. Streaming text: words and frames side by side, as many as there are
frames; the words left over are fed one per frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from common.request import RequestError
from talker.models.qwen3_tts.config import Qwen3TTSConfig
from talker.models.qwen3_tts.model import Talker

ROLE_TOKENS = 3  # <|im_start|> assistant \n
TAIL_TOKENS = 5  # <|im_end|> \n <|im_start|> assistant \n


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


NO_CODEC = -1  # a prompt position with a text embedding only
SPEAKER_VECTOR = -2  # a codec position that takes the clone's x-vector
REF_FRAME = -3  # a codec position that takes the reference's next frame


@dataclass(frozen=True, slots=True)
class Reference:
    """In-context cloning: the reference recording's transcript tokens and codec codes."""

    text_ids: tuple[int, ...]
    codes: tuple[tuple[int, ...], ...]  # [frames][G]


@dataclass(frozen=True, slots=True)
class PromptIds:
    """Host-side token ids of one request, made on the event loop; the worker turns them into embeds."""

    text_ids: tuple[int, ...]
    instruct_ids: tuple[int, ...] | None
    codec_prefix: tuple[int, ...]
    streaming_text: bool = False
    speaker_vector: tuple[float, ...] | None = None  # a cloned voice: at the prefix's SPEAKER_VECTOR
    reference: Reference | None = None  # in-context cloning

    @property
    def token_bound(self) -> int:
        """At most this many prompt positions (the prefill); streaming text feeds part of the text later."""
        ref = self.reference
        extra = len(ref.text_ids) + len(ref.codes) + 2 if ref is not None else 0
        return len(self.text_ids) + len(self.instruct_ids or ()) + len(self.codec_prefix) + extra

    @property
    def text(self) -> tuple[int, ...]:
        return self.text_ids[ROLE_TOKENS:-TAIL_TOKENS]

    @property
    def trailing(self) -> tuple[int, ...]:
        return self.text[1:] if self.streaming_text else ()


def resolve_language(cfg: Qwen3TTSConfig, language: str | None, speaker: str | None) -> int | None:
    lang = (language or "auto").lower()
    if lang != "auto" and lang not in cfg.languages:
        names = ", ".join(["auto", *sorted(cfg.languages)])
        raise RequestError(f"unsupported language '{language}'; available: {names}", param="language")
    lang_id = None if lang == "auto" else cfg.languages[lang]
    dialect = cfg.speaker_dialect.get(speaker) if speaker else None
    if dialect and lang in ("chinese", "auto") and dialect in cfg.languages:
        lang_id = cfg.languages[dialect]
    return lang_id


def codec_prefix(
    cfg: Qwen3TTSConfig, language: str | None, speaker: str | None, vector: bool = False
) -> tuple[int, ...]:
    """language, then the speaker (a checkpoint speaker's id, or SPEAKER_VECTOR for a cloned voice), pad, bos."""
    c = cfg.codec
    lang_id = resolve_language(cfg, language, speaker)
    think = (c.nothink, c.think_bos, c.think_eos) if lang_id is None else (c.think, c.think_bos, lang_id, c.think_eos)
    spk = (SPEAKER_VECTOR,) if vector else (cfg.speakers[speaker],) if speaker else ()
    return (*think, *spk, c.pad, c.bos)


def prompt_layout(cfg: Qwen3TTSConfig, ids: PromptIds) -> tuple[list[int], list[int]]:
    """Per prompt position: the text id, and what is added to it: a codec id, NO_CODEC, SPEAKER_VECTOR or
    REF_FRAME."""
    prefix, c, x = ids.codec_prefix, cfg.codec, cfg.text
    instruct = list(ids.instruct_ids or ())
    text = [*instruct, *ids.text_ids[:ROLE_TOKENS], *[x.tts_pad] * (len(prefix) - 2), x.tts_bos]
    codec = [NO_CODEC] * (len(instruct) + ROLE_TOKENS) + list(prefix[:-1])
    if ids.reference is not None:
        words, frames = _in_context(cfg, ids, ids.reference)
        if ids.streaming_text:
            n = len(frames)
            text += words[:n] + [x.tts_pad] * (n - len(words))
            codec += frames
        else:
            text += words + [x.tts_pad] * len(frames)
            codec += [c.pad] * len(words) + frames
    elif ids.streaming_text:
        text += ids.text[:1]
        codec += prefix[-1:]
    else:
        body = [*ids.text, x.tts_eos]
        text += [*body, x.tts_pad]
        codec += [c.pad] * len(body) + [c.bos]
    return text, codec


def _in_context(cfg: Qwen3TTSConfig, ids: PromptIds, ref: Reference) -> tuple[list[int], list[int]]:
    """The words (the reference's transcript, the text, tts_eos) and the frames (codec_bos, the reference's)."""
    return [*ref.text_ids, *ids.text, cfg.text.tts_eos], [cfg.codec.bos, *[REF_FRAME] * len(ref.codes)]


@torch.inference_mode()
def prompt_embeds(
    talker: Talker, cfg: Qwen3TTSConfig, prompts: list[PromptIds], device: torch.device
) -> tuple[Tensor, list[int]]:
    """All prompts' embeddings in one embedding call per table -> x: [n, T_max, H] right-padded, and each T_i."""
    layouts = [prompt_layout(cfg, p) for p in prompts]
    lengths = [len(text) for text, _ in layouts]
    text = torch.tensor([i for t, _ in layouts for i in t], dtype=torch.long, device=device)  # [sum T_i]
    codec = torch.tensor([i for _, c in layouts for i in c], dtype=torch.long, device=device)
    has_codec = (codec >= 0)[:, None]
    emb = talker.embed_text(text)  # [sum T_i, H]
    emb = torch.where(has_codec, emb + talker.embed_codec(codec.clamp(min=0)), emb)
    if vectors := [p.speaker_vector for p in prompts if p.speaker_vector is not None]:
        emb[codec == SPEAKER_VECTOR] += torch.tensor(vectors, dtype=emb.dtype, device=device)  # [n_clones, H]
    if frames := [f for p in prompts if p.reference is not None for f in p.reference.codes]:
        emb[codec == REF_FRAME] += talker.embed_frames(torch.tensor(frames, dtype=torch.long, device=device))
    return torch.nn.utils.rnn.pad_sequence(list(emb.split(lengths)), batch_first=True), lengths


def trailing_text(cfg: Qwen3TTSConfig, ids: PromptIds) -> list[int]:
    """Text tokens fed at frames 0, 1, ...: the rest of the text and tts_eos (streaming text only); tts_pad after."""
    if not ids.streaming_text:
        return []
    if ids.reference is not None:
        words, frames = _in_context(cfg, ids, ids.reference)
        return words[len(frames):]
    return [*ids.trailing, cfg.text.tts_eos]

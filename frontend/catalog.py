"""A checkpoint's voices by name, by its kind: named speakers (CustomVoice), descriptions (VoiceDesign), or none
built in (Base, whose voices are cloned from recordings and arrive with each request as a `ClonePrompt`)."""

from __future__ import annotations

from dataclasses import dataclass

from common.request import VoiceKind
from talker.models.qwen3_tts.config import CheckpointError, Qwen3TTSConfig

OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse", "marin", "cedar",
)
# A VoiceDesign checkpoint speaks the voice its instruction describes; OpenAI's names get a description each, so
# that a client which always sends one of them (the SDK does) gets a voice, not an error.
DESCRIPTIONS = {
    "alloy": "A neutral, balanced adult voice, clear and even.",
    "ash": "A warm male voice, relaxed and conversational.",
    "ballad": "A soft, expressive male voice with a gentle, melodic delivery.",
    "coral": "A bright, friendly female voice, upbeat and clear.",
    "echo": "A calm, steady male voice, speaking at a measured pace.",
    "fable": "A lively storyteller's voice, animated and engaging.",
    "onyx": "A deep, resonant male voice, confident and slow.",
    "nova": "A young, energetic female voice, crisp and cheerful.",
    "sage": "A composed, thoughtful voice, mature and reassuring.",
    "shimmer": "A light, airy female voice, soft and smooth.",
    "verse": "A versatile, expressive voice with natural intonation.",
    "marin": "A natural female voice, warm and conversational.",
    "cedar": "A natural male voice, grounded and warm.",
}


@dataclass(frozen=True, slots=True)
class Voice:
    name: str
    speaker: str | None  # the checkpoint speaker it maps onto (CustomVoice)
    alias_of: str | None = None
    description: str | None = None  # what a VoiceDesign checkpoint is told (its instruction)


def voice_kind(cfg: Qwen3TTSConfig) -> VoiceKind:
    try:
        return VoiceKind(cfg.model_type)
    except ValueError:
        kinds = ", ".join(k.value for k in VoiceKind)
        raise CheckpointError(f"unknown tts_model_type '{cfg.model_type}' in config.json; known: {kinds}") from None


def build_voices(cfg: Qwen3TTSConfig) -> dict[str, Voice]:
    """CustomVoice: the speakers, plus OpenAI's voice names mapped onto them in turn. VoiceDesign: OpenAI's names,
    each a description. Base: none (its voices are made from recordings)."""
    kind = voice_kind(cfg)
    if kind is VoiceKind.VOICE_DESIGN:
        return {name: Voice(name, None, description=text) for name, text in DESCRIPTIONS.items()}
    if kind is VoiceKind.BASE:
        return {}
    speakers = sorted(cfg.speakers)
    voices = {s: Voice(s, s) for s in speakers}
    for i, name in enumerate(OPENAI_VOICES):
        if name not in voices:
            target = speakers[i % len(speakers)] if speakers else None
            voices[name] = Voice(name, target, alias_of=target)
    return voices

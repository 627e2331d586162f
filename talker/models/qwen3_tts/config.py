"""Checkpoint configuration of a Qwen3-TTS model, read from its own config.json files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint directory is missing a file or holds a malformed one."""


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"malformed checkpoint file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"malformed checkpoint file {path}: expected a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class DecoderArch:
    """A Qwen3-style decoder stack (the Talker backbone or the code predictor)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int

    @property
    def linear_params(self) -> int:
        """Weights of the stack's linear layers: what one token's pass through it reads."""
        h, d = self.hidden_size, self.head_dim
        attention = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        return self.num_layers * (attention + 3 * h * self.intermediate_size)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecoderArch:
        heads = int(d["num_attention_heads"])
        return cls(
            hidden_size=int(d["hidden_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads", heads)),
            head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
            intermediate_size=int(d["intermediate_size"]),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            vocab_size=int(d["vocab_size"]),
        )


@dataclass(frozen=True, slots=True)
class CodecIds:
    pad: int
    bos: int
    eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True, slots=True)
class TextIds:
    tts_pad: int
    tts_bos: int
    tts_eos: int
    im_start: int
    im_end: int


@dataclass(frozen=True, slots=True)
class Qwen3TTSConfig:
    talker: DecoderArch
    predictor: DecoderArch
    num_code_groups: int
    text_vocab_size: int
    text_hidden_size: int
    codec: CodecIds
    text: TextIds
    speakers: dict[str, int]
    speaker_dialect: dict[str, str | None]
    languages: dict[str, int]
    model_type: str
    model_size: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config.json") -> Qwen3TTSConfig:
        try:
            t = d["talker_config"]
            dialect = {k.lower(): (v if v else None) for k, v in t.get("spk_is_dialect", {}).items()}
            return cls(
                talker=DecoderArch.from_dict(t),
                predictor=DecoderArch.from_dict(t["code_predictor_config"]),
                num_code_groups=int(t["num_code_groups"]),
                text_vocab_size=int(t["text_vocab_size"]),
                text_hidden_size=int(t["text_hidden_size"]),
                codec=CodecIds(
                    pad=int(t["codec_pad_id"]),
                    bos=int(t["codec_bos_id"]),
                    eos=int(t["codec_eos_token_id"]),
                    think=int(t["codec_think_id"]),
                    nothink=int(t["codec_nothink_id"]),
                    think_bos=int(t["codec_think_bos_id"]),
                    think_eos=int(t["codec_think_eos_id"]),
                ),
                text=TextIds(
                    tts_pad=int(d["tts_pad_token_id"]),
                    tts_bos=int(d["tts_bos_token_id"]),
                    tts_eos=int(d["tts_eos_token_id"]),
                    im_start=int(d["im_start_token_id"]),
                    im_end=int(d["im_end_token_id"]),
                ),
                speakers={k.lower(): int(v) for k, v in (t.get("spk_id") or {}).items()},
                speaker_dialect=dialect,
                languages={k.lower(): int(v) for k, v in (t.get("codec_language_id") or {}).items()},
                model_type=str(d.get("tts_model_type", "custom_voice")),
                model_size=str(d.get("tts_model_size", "")),
                raw=d,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"malformed checkpoint file {source}: missing or invalid {exc}") from exc

    @classmethod
    def load(cls, directory: Path) -> Qwen3TTSConfig:
        path = directory / "config.json"
        return cls.from_dict(read_json(path), str(path))


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    """The checkpoint's generation_config.json, as the official package applies it."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 8192
    non_streaming_mode: bool | None = None  # an optional key; unset: the official default of the task

    @classmethod
    def load(cls, directory: Path) -> GenerationDefaults:
        path = directory / "generation_config.json"
        if not path.is_file():
            return cls()
        d = read_json(path)
        base = cls()
        kwargs = {name: type(getattr(base, name) if name != "non_streaming_mode" else True)(d[name])
                  for name in cls.__slots__ if name in d}
        return cls(**kwargs)

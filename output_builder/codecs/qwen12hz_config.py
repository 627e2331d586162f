"""The Qwen3-TTS 12 Hz codec decoder's sizes, read from and written to a speech-tokenizer ``config.json``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

# keys that live at the top of config.json, not under decoder_config
_TOP_LEVEL_KEYS = ("decode_upsample_rate", "output_sample_rate")


@dataclass(frozen=True, slots=True)
class CodecConfig:
    codebook_size: int = 2048
    codebook_dim: int = 512
    num_quantizers: int = 16
    latent_dim: int = 1024
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    sliding_window: int = 72
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    hidden_act: str = "silu"
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    decode_upsample_rate: int = 1920
    output_sample_rate: int = 24000

    def __post_init__(self) -> None:
        total = math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)
        if total != self.decode_upsample_rate:
            rate = self.decode_upsample_rate
            raise ValueError(f"upsampling factors give {total} but decode_upsample_rate is {rate}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ValueError("decoder_dim must be divisible by 2 ** len(upsample_rates)")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CodecConfig:
        """Accepts a speech-tokenizer ``config.json`` dict (with ``decoder_config``) or ``to_dict()``."""
        decoder = dict(data.get("decoder_config", data))
        scaling = decoder.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise ValueError(f"unsupported rope_scaling {scaling!r}")
        heads = decoder.get("num_attention_heads", 16)
        decoder.setdefault("head_dim", decoder.get("hidden_size", 1024) // heads)
        decoder.update({k: data[k] for k in _TOP_LEVEL_KEYS if k in data})
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in decoder.items() if k in known}
        for key in ("upsample_rates", "upsampling_ratios"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["upsample_rates"] = list(self.upsample_rates)
        out["upsampling_ratios"] = list(self.upsampling_ratios)
        return out

    def official_decoder_config(self) -> dict[str, Any]:
        out = {k: v for k, v in self.to_dict().items() if k not in _TOP_LEVEL_KEYS}
        out["attention_dropout"] = 0.0
        return out

    @classmethod
    def tiny(cls) -> CodecConfig:
        """Sizes of the tiny official test checkpoint (hidden 32, decoder_dim 64, one transformer layer)."""
        return cls(
            codebook_dim=32,
            latent_dim=32,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            decoder_dim=64,
        )

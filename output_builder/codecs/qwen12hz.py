"""Qwen3-TTS 12 Hz codec decoder: codes [B, Q, T] -> 24 kHz waveform, one-shot or as batched streaming chunks.

Loads the ``speech_tokenizer/`` directory of an official checkpoint unchanged (its ``decoder.*`` tensors).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from output_builder.codecs.native import NativeKernels
from output_builder.codecs.qwen12hz_config import CodecConfig
from output_builder.codecs.qwen12hz_decoder import Qwen12HzDecoder, init_audible_
from output_builder.codecs.qwen12hz_stream import DecodeStream, StreamingDecoder

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PARAM_PREFIX = "decoder."
Template = Mapping[str, Any] | str | Path | None


class Qwen12HzCodec:
    """Owns a :class:`Qwen12HzDecoder` and its config; all decode entry points return float32 CPU tensors."""

    def __init__(self, module: Qwen12HzDecoder, *, raw_config: Mapping[str, Any] | None = None) -> None:
        self.module = module.eval()
        self.config = module.cfg
        self.sample_rate = self.config.output_sample_rate
        self.samples_per_frame = self.config.decode_upsample_rate
        self.num_quantizers = self.config.num_quantizers
        self._raw_config = dict(raw_config) if raw_config is not None else None
        self._streamer = StreamingDecoder(self.module)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> Qwen12HzCodec:
        """``path`` is a ``speech_tokenizer/`` directory, or a model directory that contains one."""
        root = Path(path)
        if (root / "speech_tokenizer").is_dir():
            root = root / "speech_tokenizer"
        raw = _read_json(root / CONFIG_FILE)
        cfg = CodecConfig.from_dict(raw)
        with torch.device("meta"):
            module = Qwen12HzDecoder(cfg)
        _load_weights(module, root / WEIGHTS_FILE)
        module.to(device=device, dtype=dtype)
        return cls(module, raw_config=raw)

    @classmethod
    def from_config(cls, cfg: CodecConfig, seed: int, device: str | torch.device = "cpu") -> Qwen12HzCodec:
        """Seeded random weights that give audible noise (RMS ~0.15), for tests and the default tiny model."""
        module = Qwen12HzDecoder(cfg)
        init_audible_(module, seed)
        return cls(module.to(device))

    def save_pretrained(self, path: str | Path, template: Template = None) -> None:
        """Writes an official-layout ``speech_tokenizer/`` directory (decoder weights only).

        ``template`` (a config dict, a ``config.json`` or its directory) supplies ``encoder_config`` and the
        other top-level keys; without one the loaded config is reused, or else a minimal valid one.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        config = _official_config(self.config, self._template(template))
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        preprocessor = _preprocessor_config(self.sample_rate)
        (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
        state = {PARAM_PREFIX + k: v.detach().cpu().contiguous() for k, v in self.module.state_dict().items()}
        save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})

    def _template(self, template: Template) -> Mapping[str, Any]:
        if template is None:
            return self._raw_config or {}
        if isinstance(template, Mapping):
            return template
        file = Path(template)
        return _read_json(file / CONFIG_FILE if file.is_dir() else file)

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """One-shot decode. codes: [B, Q, T] -> wav: [B, T * samples_per_frame] float32 on CPU."""
        if codes.dim() != 3 or codes.shape[1] != self.num_quantizers:
            raise ValueError(f"expected codes [B, {self.num_quantizers}, T], got {tuple(codes.shape)}")
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0)
        wav = self.module(codes.to(self.device, torch.long))
        return wav.float().cpu()

    @property
    def native_kernels(self) -> bool:
        return self._streamer.ops.native is not None

    def use_native(self, kernels: NativeKernels | None) -> None:
        """Streaming decode on the CPU runs its convolutions and SnakeBeta through ``kernels`` (None: torch)."""
        self._streamer.ops.native = kernels

    def between_stages(self, hook: Callable[[], None] | None) -> None:
        """``hook`` runs between the stages of :meth:`decode_streams` (a few per call); it may decode other
        streams, as long as it does not run a stream of the call it interrupts."""
        self._streamer.between = hook

    def open_stream(self) -> DecodeStream:
        """A fresh per-request decoder state (zeros: the one-shot padding) for :meth:`decode_streams`."""
        return self._streamer.open()

    @torch.inference_mode()
    def decode_streams(self, jobs: list[tuple[DecodeStream, Tensor]]) -> list[Tensor]:
        """Exact incremental decode: each job is (state, codes [Q, N]) and gets N * samples_per_frame samples.

        Decodes only the N new frames of each job and advances its state; the pieces of a stream concatenate
        to :meth:`decode` of all its codes. Jobs with equal N share one batch. A state may appear only once.
        """
        return self._streamer.decode(jobs)


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise FileNotFoundError(f"codec config not found: {file}")
    data: dict[str, Any] = json.loads(file.read_text())
    return data


def _load_weights(module: nn.Module, file: Path) -> None:
    if not file.is_file():
        raise FileNotFoundError(f"codec weights not found: {file}")
    with safe_open(str(file), framework="pt") as handle:
        names = [k for k in handle.keys() if k.startswith(PARAM_PREFIX)]  # noqa: SIM118
        state = {k[len(PARAM_PREFIX) :]: handle.get_tensor(k) for k in names}
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        detail = f"missing {missing[:8]}, unexpected {unexpected[:8]}"
        raise ValueError(f"{file}: decoder tensors do not match the model; {detail}")
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as err:
        raise ValueError(f"{file}: {err}") from err


_MINIMAL_ENCODER_CONFIG: dict[str, Any] = {
    "model_type": "mimi",
    "audio_channels": 1,
    "sampling_rate": 24000,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "codebook_size": 2048,
    "codebook_dim": 32,
    "vector_quantization_hidden_dimension": 32,
    "num_filters": 4,
    "num_quantizers": 16,
    "num_semantic_quantizers": 1,
    "upsampling_ratios": [8, 6, 5, 4],
    "upsample_groups": 32,
    "use_causal_conv": True,
    "sliding_window": 250,
}


def _official_config(cfg: CodecConfig, template: Mapping[str, Any]) -> dict[str, Any]:
    config = {k: v for k, v in template.items() if k != "decoder_config"}
    config.setdefault("encoder_config", _MINIMAL_ENCODER_CONFIG)
    config.setdefault("encoder_valid_num_quantizers", cfg.num_quantizers)
    config.setdefault("input_sample_rate", cfg.output_sample_rate)
    config.setdefault("encode_downsample_rate", cfg.decode_upsample_rate)
    config.update(
        architectures=["Qwen3TTSTokenizerV2Model"],
        model_type=MODEL_TYPE,
        decoder_config=cfg.official_decoder_config(),
        decode_upsample_rate=cfg.decode_upsample_rate,
        output_sample_rate=cfg.output_sample_rate,
    )
    return config


def _preprocessor_config(sample_rate: int) -> dict[str, Any]:
    return {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
            "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": sample_rate}

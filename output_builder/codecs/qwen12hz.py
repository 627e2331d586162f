"""Qwen3-TTS 12 Hz codec decoder: codes [B, Q, T] -> 24 kHz waveform, one-shot or as batched streaming chunks.

Loads the ``speech_tokenizer/`` directory of an official checkpoint unchanged (its ``decoder.*`` tensors).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from output_builder.codecs.native import NativeKernels
from output_builder.codecs.qwen12hz_layers import (
    CausalConv1d,
    CausalTransConv1d,
    ConvNeXtBlock,
    DecoderBlock,
    ResidualUnit,
    SlidingTransformer,
    SnakeBeta,
    SplitResidualVQ,
    init_audible_,
)
from output_builder.codecs.qwen12hz_stream import DecodeStream, StreamingDecoder

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PARAM_PREFIX = "decoder."
DEFAULT_MAX_LEFT_CONTEXT = 96
PRE_CONV_KERNEL = 3
WAVE_CONV_KERNEL = 7
_TOP_LEVEL_KEYS = ("decode_upsample_rate", "output_sample_rate")
Template = Mapping[str, Any] | str | Path | None


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


class Qwen12HzDecoder(nn.Module):
    """The official ``Qwen3TTSTokenizerV2Decoder`` with the same parameter names, written for inference."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitResidualVQ(cfg.num_quantizers, cfg.codebook_size, cfg.codebook_dim)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, PRE_CONV_KERNEL)
        self.pre_transformer = SlidingTransformer(cfg)
        dim = cfg.latent_dim
        self.upsample = nn.Sequential(
            *(
                nn.Sequential(CausalTransConv1d(dim, dim, r, r), ConvNeXtBlock(dim))
                for r in cfg.upsampling_ratios
            )
        )
        widths = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        stages: list[nn.Module] = [CausalConv1d(dim, widths[0], WAVE_CONV_KERNEL)]
        stages += [DecoderBlock(widths[i], widths[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
        stages += [SnakeBeta(widths[-1]), CausalConv1d(widths[-1], 1, WAVE_CONV_KERNEL)]
        self.decoder = nn.Sequential(*stages)

    def synthesize(self, codes: Tensor) -> Tensor:
        """Unclamped waveform. codes: [B, Q, T] -> [B, T * upsample]."""
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"expected codes [B, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")
        h = self.pre_conv(self.quantizer.decode(codes))  # h: [B, latent, T]
        h = self.pre_transformer(h.transpose(1, 2)).transpose(1, 2)
        return self.decoder(self.upsample(h)).squeeze(1)  # [B, 1, T * upsample] -> [B, T * upsample]

    def forward(self, codes: Tensor) -> Tensor:
        # codes: [B, Q, T] int64 -> wav: [B, T * upsample] in [-1, 1]
        return self.synthesize(codes).clamp(-1.0, 1.0)


def receptive_field_frames(cfg: CodecConfig) -> int:
    """How many frames before frame t can change the first sample of frame t (exact, from the kernels)."""
    reach = -CausalConv1d.reach(WAVE_CONV_KERNEL)  # earliest input index seen from output sample 0
    for rate in reversed(cfg.upsample_rates):
        reach -= sum(CausalConv1d.reach(ResidualUnit.kernel_size, d) for d in DecoderBlock.dilations)
        reach = reach // rate - 1  # kernel 2*rate, stride rate: one extra input step to the left
    reach -= CausalConv1d.reach(WAVE_CONV_KERNEL)
    for ratio in reversed(cfg.upsampling_ratios):
        reach -= CausalConv1d.reach(ConvNeXtBlock.kernel_size)
        reach //= ratio
    reach -= cfg.num_hidden_layers * (cfg.sliding_window - 1)
    reach -= CausalConv1d.reach(PRE_CONV_KERNEL)
    return -reach


@dataclass(slots=True)
class ChunkJob:
    """``codes``: [Q, C + N], C = ``context`` frames of left context followed by N new frames."""

    codes: Tensor
    context: int

    @property
    def new_frames(self) -> int:
        return int(self.codes.shape[-1]) - self.context


class Qwen12HzCodec:
    """Owns a :class:`Qwen12HzDecoder` and its config; all decode entry points return float32 CPU tensors."""

    def __init__(
        self,
        module: Qwen12HzDecoder,
        *,
        max_left_context: int = DEFAULT_MAX_LEFT_CONTEXT,
        raw_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.module = module.eval()
        self.config = module.cfg
        self.sample_rate = self.config.output_sample_rate
        self.samples_per_frame = self.config.decode_upsample_rate
        self.num_quantizers = self.config.num_quantizers
        self.receptive_field_frames = receptive_field_frames(self.config)
        self.max_left_context = max_left_context
        self._raw_config = dict(raw_config) if raw_config is not None else None
        self._streamer = StreamingDecoder(self.module)

    @property
    def left_context_frames(self) -> int:
        return min(self.receptive_field_frames, self.max_left_context)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        *,
        max_left_context: int = DEFAULT_MAX_LEFT_CONTEXT,
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
        return cls(module, max_left_context=max_left_context, raw_config=raw)

    @classmethod
    def from_config(
        cls,
        cfg: CodecConfig,
        seed: int,
        device: str | torch.device = "cpu",
        *,
        max_left_context: int = DEFAULT_MAX_LEFT_CONTEXT,
    ) -> Qwen12HzCodec:
        """Seeded random weights that give audible noise (RMS ~0.15), for tests and the default tiny model."""
        module = Qwen12HzDecoder(cfg)
        init_audible_(module, seed)
        return cls(module.to(device), max_left_context=max_left_context)

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

    @torch.inference_mode()
    def decode_chunks(self, chunks: list[ChunkJob]) -> list[Tensor]:
        """Decodes all jobs as one right-padded batch; returns each job's N * samples_per_frame samples."""
        for job in chunks:
            self._check_job(job)
        longest = max((int(job.codes.shape[-1]) for job in chunks), default=0)
        if longest == 0:
            return [torch.zeros(0) for _ in chunks]
        padded = [F.pad(job.codes.to(torch.long), (0, longest - job.codes.shape[-1])) for job in chunks]
        wav = self.module(torch.stack(padded).to(self.device)).float().cpu()  # wav: [B, longest * spf]
        spf = self.samples_per_frame
        return [
            wav[i, job.context * spf : (job.context + job.new_frames) * spf].clone()
            for i, job in enumerate(chunks)
        ]

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

    def _check_job(self, job: ChunkJob) -> None:
        if job.codes.dim() != 2 or job.codes.shape[0] != self.num_quantizers:
            shape = tuple(job.codes.shape)
            raise ValueError(f"ChunkJob.codes must be [{self.num_quantizers}, C + N], got {shape}")
        if not 0 <= job.context <= job.codes.shape[1]:
            raise ValueError(f"ChunkJob.context {job.context} outside [0, {job.codes.shape[1]}]")


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

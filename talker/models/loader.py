"""Loads a Talker checkpoint directory (Hugging Face layout) onto a device. Nothing is fetched."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from talker.models.pack import pack_for_batches
from talker.models.quantize import quantize_int8
from talker.models.qwen3_tts.config import CheckpointError, GenerationDefaults, Qwen3TTSConfig
from talker.models.qwen3_tts.model import Qwen3TTSModel

log = logging.getLogger("talkstream.loader")

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
IGNORED_PREFIXES = ("speaker_encoder.",)


@dataclass(slots=True)
class LoadedTalker:
    path: Path
    cfg: Qwen3TTSConfig
    generation: GenerationDefaults
    model: Qwen3TTSModel
    weights_bytes: int  # resident: full-precision parameters, plus the int8 weights or the packed copies


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype '{name}'; use one of auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("model*.safetensors"))
    if not files:
        raise CheckpointError(f"missing checkpoint file: {directory / 'model.safetensors'}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"malformed checkpoint file {f}: {exc}") from exc
    return weights


def load_talker(
    path: str | Path, device: torch.device, dtype: torch.dtype, quantize: str | None = None, batches: bool = True
) -> LoadedTalker:
    """batches: requests may share a step (max batch > 1), so full precision on the CPU packs for batches."""
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"model directory not found: {directory}")
    cfg = Qwen3TTSConfig.load(directory)
    generation = GenerationDefaults.load(directory)
    with torch.device("meta"):
        model = Qwen3TTSModel(cfg)
    weights = {k: v for k, v in read_weights(directory).items() if not k.startswith(IGNORED_PREFIXES)}
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {directory / 'model.safetensors'} does not match config.json: "
            f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}"
        )
    model.load_state_dict(weights, assign=True, strict=True)
    model = model.to(device=device, dtype=dtype)
    model.eval().requires_grad_(False)
    extra_bytes = 0
    if quantize == "int8":
        if device.type == "cpu" and dtype != torch.float32:
            raise ValueError("int8 on the CPU takes float32 activations: leave dtype at auto or float32")
        with torch.inference_mode():
            q = quantize_int8(model)
        extra_bytes = q.bytes_after
        log.info("int8: %d linear layers, %.0f MiB -> %.0f MiB", q.layers, q.bytes_before / 2**20,
                 q.bytes_after / 2**20)
    elif batches:
        with torch.inference_mode():
            extra_bytes = pack_for_batches(model)
        if extra_bytes:
            log.info("batches of 4+ rows: %.0f MiB of layer weights packed for oneDNN", extra_bytes / 2**20)
    resident = sum(t.numel() * t.element_size() for t in model.parameters()) + extra_bytes
    return LoadedTalker(directory, cfg, generation, model, resident)


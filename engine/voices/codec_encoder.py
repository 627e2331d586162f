"""The 12 Hz speech tokenizer's encoder: a 24 kHz reference recording -> the codes [frames, 16] that voice cloning
puts in the Talker's prompt.

The official tokenizer's encoder *is* transformers' Mimi (its class subclasses `MimiModel` and only drops the decoder
half), so this builds transformers' `MimiModel` with its decoder dropped and loads the ``encoder.*`` tensors of the
checkpoint's ``speech_tokenizer/model.safetensors``. The network, the causal padding and the nearest-codeword search
are the library's own, which is what keeps the codes identical to the official ones (tests/engine/voices pins them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from transformers import MimiConfig, MimiModel
from transformers.initialization import no_init_weights

from talker.models.qwen3_tts.config import CheckpointError, read_json

TOKENIZER_DIR = "speech_tokenizer"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PARAM_PREFIX = "encoder."  # the tokenizer's own prefix; its decoder's tensors sit beside these as `decoder.*`

# The checkpoint keeps Mimi's original flat layout (`encoder.layers`, `encoder_transformer`, `downsample`,
# `quantizer`); transformers' MimiModel nests the encoder half under `encoder.` and names its SEANet stack
# `encoder_seanet`. The same renames as transformers' own conversion mapping for Mimi, applied by hand because the
# tensors are read from a file that also holds the (Qwen-specific) decoder.
_RENAMES = (
    ("encoder.layers.", "encoder.encoder_seanet.layers."),
    ("encoder_transformer.", "encoder.encoder_transformer."),
    ("downsample.", "encoder.downsample."),
    ("quantizer.", "quantizer."),
)


class CodecEncoder:
    """Encodes float32 mono 24 kHz audio into the tokenizer's codes, as the official `speech_tokenizer.encode`."""

    def __init__(self, model: MimiModel, *, num_quantizers: int, frame_samples: int, sample_rate: int) -> None:
        self._model = model
        self.num_quantizers = num_quantizers
        self.frame_samples = frame_samples
        self.sample_rate = sample_rate

    @property
    def device(self) -> torch.device:
        return next(self._model.parameters()).device

    def encode(self, wav: np.ndarray) -> torch.Tensor:
        """``wav``: [samples] at `sample_rate` -> codes [frames, num_quantizers] int64 on the CPU, with
        frames = ceil(samples / frame_samples): a last partial frame is kept, as the official encoder keeps it."""
        if wav.ndim != 1 or wav.shape[0] == 0:
            raise ValueError(f"expected a non-empty mono waveform [samples], got shape {wav.shape}")
        # the official tokenizer casts its input to float32 before encoding
        samples = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32))
        x = samples.to(self.device)[None, None]  # x: [B=1, channels=1, samples]
        with torch.inference_mode():
            # Quantizing is residual, so the first `num_quantizers` codes do not depend on the codebooks after them:
            # stopping there gives the official codes, which encodes with all of them and then slices.
            codes = self._model.encode(x, num_quantizers=self.num_quantizers).audio_codes  # codes: [1, Q, F']
        # The official encoder keeps ceil(samples / frame_samples) frames of what Mimi returns.
        frames = -(-wav.shape[0] // self.frame_samples)
        return codes[0, :, :frames].transpose(0, 1).to("cpu", torch.int64).contiguous()  # [F, Q]


def load_codec_encoder(directory: Path, device: torch.device | None = None) -> CodecEncoder | None:
    """The encoder of the checkpoint at ``directory`` (read from its ``speech_tokenizer/``), or None when that
    tokenizer carries no ``encoder.*`` tensors (checkpoints that cannot clone a voice need none).

    Raises CheckpointError when the tokenizer's files are missing, or its encoder tensors or config are malformed or
    do not match each other."""
    root = Path(directory) / TOKENIZER_DIR
    state = _read_encoder_tensors(root / WEIGHTS_FILE)
    if not state:
        return None
    raw = read_json(root / CONFIG_FILE)
    config = _mimi_config(raw, root / CONFIG_FILE)
    num_quantizers = _valid_quantizers(raw, config, root / CONFIG_FILE)
    model = _build_model(config, state, root / WEIGHTS_FILE)
    torch.nn.Module.to(model, device or torch.device("cpu"))  # PreTrainedModel.to's wrapper hides its signature
    return CodecEncoder(
        model, num_quantizers=num_quantizers, frame_samples=config.frame_size, sample_rate=config.sampling_rate
    )


def _read_encoder_tensors(file: Path) -> dict[str, torch.Tensor]:
    """The ``encoder.*`` tensors of ``file``, under MimiModel's names; only those are read from disk."""
    if not file.is_file():
        raise CheckpointError(f"missing checkpoint file: {file}")
    try:
        with safe_open(str(file), framework="pt") as handle:
            names = [k for k in handle.keys() if k.startswith(PARAM_PREFIX)]  # noqa: SIM118 (a handle, not a dict)
            flat = {k[len(PARAM_PREFIX) :]: handle.get_tensor(k) for k in names}
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"malformed checkpoint file {file}: {exc}") from exc
    return {_mimi_name(k, file): v for k, v in flat.items()}


def _mimi_name(flat: str, file: Path) -> str:
    for old, new in _RENAMES:
        if flat.startswith(old):
            return new + flat[len(old) :]
    raise CheckpointError(f"{file}: unexpected encoder tensor {PARAM_PREFIX}{flat}")


def _mimi_config(raw: dict[str, Any], file: Path) -> MimiConfig:
    encoder = raw.get("encoder_config")
    if not isinstance(encoder, dict) or encoder.get("model_type") != "mimi":
        raise CheckpointError(f"{file}: the tokenizer has encoder weights but no mimi `encoder_config`")
    # `_frame_rate` and `rope_theta` are the names 4.x saved; MimiConfig still reads both.
    fields = {k: v for k, v in encoder.items() if k != "model_type"}
    try:
        config = MimiConfig(**fields)
        config.decoder_config = None  # the tokenizer's decoder is not Mimi's, and encoding needs none
    except (TypeError, ValueError, StrictDataclassError) as exc:
        raise CheckpointError(f"{file}: malformed `encoder_config`: {exc}") from exc
    _check_rates(raw, config, file)
    return config


def _check_rates(raw: dict[str, Any], config: MimiConfig, file: Path) -> None:
    """The frame count rule uses the tokenizer's `encode_downsample_rate`; Mimi's strides must agree with it."""
    expected = {"encode_downsample_rate": config.frame_size, "input_sample_rate": config.sampling_rate}
    for key, value in expected.items():
        if key in raw and raw[key] != value:
            raise CheckpointError(f"{file}: `{key}` is {raw[key]}, but the encoder_config gives {value}")


def _valid_quantizers(raw: dict[str, Any], config: MimiConfig, file: Path) -> int:
    """How many codebooks the Talker reads: the official tokenizer keeps only the first ones of Mimi's."""
    valid = raw.get("encoder_valid_num_quantizers", config.num_quantizers)
    lowest = config.num_semantic_quantizers
    if not isinstance(valid, int) or not lowest <= valid <= config.num_quantizers:
        raise CheckpointError(
            f"{file}: `encoder_valid_num_quantizers` {valid!r} outside [{lowest}, {config.num_quantizers}]"
        )
    return valid


def _build_model(config: MimiConfig, state: dict[str, torch.Tensor], file: Path) -> MimiModel:
    # Every parameter and persistent buffer is overwritten by the strict load below, so random init is wasted work.
    with no_init_weights():
        model = MimiModel(config)
    expected = model.state_dict()
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    mismatch = f"{file}: encoder tensors do not match its encoder_config:"
    if missing or unexpected:
        raise CheckpointError(f"{mismatch} missing {missing[:8]}, unexpected {unexpected[:8]}")
    wrong = [
        f"{k} {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in state.items() if v.shape != expected[k].shape
    ]
    if wrong:
        raise CheckpointError(f"{mismatch} {wrong[:4]}")
    model.load_state_dict(state, strict=True)  # copies into the float32 parameters, whatever the file's dtype
    return model.eval()

"""The other checkpoint kinds of `talkstream export-tiny --kind`: VoiceDesign and Base (voice cloning), with random
weights at the tiny or the real sizes, for tests and benchmarks of voice creation.

The Talker is the same in every kind (tiny.py draws it); what differs is the config (the kind, the speakers) and, for
Base, the two encoders that turn a recording into a clone prompt: the speaker encoder (`speaker_encoder.*` in
model.safetensors, `speaker_encoder_config` in config.json) and the 12 Hz tokenizer's Mimi encoder (`encoder.*` in
speech_tokenizer/model.safetensors, `encoder_config` in its config.json). Their weights are random, drawn with
PortableRandom so that an export is the same bits on every CPU, and scaled so that activations keep their size
through the layers (the codes and x-vectors are then spread out, as a trained encoder's are, not all alike).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from common.portable_random import PortableRandom
from engine.voices.speaker_encoder import PREFIX as SPEAKER_PREFIX
from engine.voices.speaker_encoder import SpeakerEncoder, SpeakerEncoderArch
from output_builder.codecs.qwen12hz import Qwen12HzCodec

KINDS = ("custom_voice", "base", "voice_design")
SPEAKER_SEED, MIMI_SEED = 4321, 4322  # apart from tiny.py's, so the Talker's draws are the same in every kind

# Qwen3-TTS Base's speaker encoder (its config's defaults); enc_dim is the Talker's hidden size, set at export
SPEAKER_REAL = {"mel_dim": 128, "enc_channels": [512, 512, 512, 512, 1536], "enc_kernel_sizes": [5, 3, 3, 3, 1],
                 "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 128, "enc_res2net_scale": 8,
                 "enc_se_channels": 128, "sample_rate": 24000}
SPEAKER_TINY = {**SPEAKER_REAL, "enc_channels": [32, 32, 32, 32, 96], "enc_attention_channels": 16,
                 "enc_se_channels": 16}

# The 12 Hz tokenizer's encoder is Mimi at its defaults: 24 kHz, strides 8*6*5*4 then 2 (1920 samples a frame,
# 12.5 Hz), 32 codebooks of which the tokenizer keeps the first 16 (`encoder_valid_num_quantizers`)
MIMI_REAL: dict[str, Any] = {
    "model_type": "mimi", "sampling_rate": 24000, "audio_channels": 1, "_frame_rate": None,
    "hidden_size": 512, "num_filters": 64, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4],
    "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2,
    "use_causal_conv": True, "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0,
    "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32, "num_semantic_quantizers": 1,
    "vector_quantization_hidden_dimension": 256, "use_conv_shortcut": False, "upsample_groups": 512,
    "num_hidden_layers": 8, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "gelu", "max_position_embeddings": 8000, "rope_theta": 10000.0,
    "sliding_window": 250, "norm_eps": 1e-5, "layer_scale_initial_scale": 0.01, "initializer_range": 0.02,
    "attention_bias": False, "attention_dropout": 0.0, "use_cache": False, "use_streaming": False,
}
# small layers, but the real strides (the frame is 1920 samples whatever the size) and codebook counts
MIMI_TINY = {**MIMI_REAL, "hidden_size": 32, "num_filters": 4, "num_hidden_layers": 1, "intermediate_size": 64,
              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "codebook_dim": 16,
              "vector_quantization_hidden_dimension": 16, "upsample_groups": 32}
VALID_QUANTIZERS = 16  # the Talker's code groups
FRAME_SAMPLES = 1920


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")


def kind_config(config: dict[str, Any], kind: str, size: str) -> dict[str, Any]:
    """config.json of `kind`: custom_voice is tiny.py's unchanged; the others have no speakers, and Base has the
    speaker encoder's config (its x-vector as wide as the Talker's hidden state)."""
    check_kind(kind)
    if kind == "custom_voice":
        return config
    talker = dict(config["talker_config"], spk_id={}, spk_is_dialect={})
    out = dict(config, tts_model_type=kind, talker_config=talker)
    if kind == "base":
        sizes = SPEAKER_TINY if size == "tiny" else SPEAKER_REAL
        out["speaker_encoder_config"] = {**sizes, "enc_dim": talker["hidden_size"]}
    return out


def kind_weights(config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Tensors model.safetensors holds beside the Talker's: Base's speaker encoder, none for the other kinds."""
    spec = config.get("speaker_encoder_config")
    if spec is None:
        return {}
    arch = SpeakerEncoderArch.from_dict(spec, "the exported config")
    with torch.device("meta"):  # only the names and shapes: every tensor is drawn below
        shapes = {k: v.shape for k, v in SpeakerEncoder(arch).state_dict().items()}
    draws = PortableRandom(SPEAKER_SEED)
    return {SPEAKER_PREFIX + k: _draw(k, shape, draws) for k, shape in shapes.items()}


def write_speech_tokenizer(codec: Qwen12HzCodec, directory: Path, kind: str, size: str) -> None:
    """speech_tokenizer/: the codec's decoder, and for Base the Mimi encoder too."""
    if kind != "base":
        codec.save_pretrained(directory)
        return
    mimi = MIMI_TINY if size == "tiny" else MIMI_REAL
    codec.save_pretrained(directory, template={
        "encoder_config": mimi, "encoder_valid_num_quantizers": VALID_QUANTIZERS,
        "input_sample_rate": mimi["sampling_rate"], "encode_downsample_rate": FRAME_SAMPLES,
    })
    weights = directory / "model.safetensors"
    state = load_file(str(weights)) | mimi_encoder_weights(mimi)
    save_file(state, str(weights), metadata={"format": "pt"})


def mimi_encoder_weights(encoder_config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Random Mimi encoder tensors under the names the official tokenizer stores them by (`encoder.*`, Mimi's
    original flat layout), the inverse of codec_encoder.py's renames, so that it loads them as a real checkpoint's."""
    # transformers is imported here, not at the top: only a Base export needs it
    from transformers import MimiConfig, MimiModel
    from transformers.initialization import no_init_weights

    from engine.voices.codec_encoder import _RENAMES, PARAM_PREFIX

    config = MimiConfig(**{k: v for k, v in encoder_config.items() if k != "model_type"})
    config.decoder_config = None  # as codec_encoder.py builds it: the tokenizer's decoder is not Mimi's
    with torch.device("meta"), no_init_weights():
        shapes = {k: v.shape for k, v in MimiModel(config).state_dict().items()}
    draws = PortableRandom(MIMI_SEED)
    out = {}
    for name, shape in shapes.items():
        flat = next(old + name[len(new):] for old, new in _RENAMES if name.startswith(new))
        out[PARAM_PREFIX + flat] = _draw(name, shape, draws, layer_scale=config.layer_scale_initial_scale)
    return out


def _draw(name: str, shape: torch.Size, draws: PortableRandom, layer_scale: float = 0.01) -> torch.Tensor:
    """One tensor: matrices and kernels scaled by 1/sqrt(fan-in) (activations keep their size layer after layer),
    codebooks of unit entries with a usage of one each (a codeword is embed_sum / cluster_usage), norms one, layer
    scales as Mimi initialises them, biases zero."""
    if name.endswith("embed_sum"):
        return draws.normal(shape, 1.0)
    if name.endswith(("cluster_usage", "initialized")) or (name.endswith("norm.weight")):
        return torch.ones(shape)
    if name.endswith("layer_scale.scale"):
        return torch.full(shape, layer_scale)
    if len(shape) >= 2:
        return draws.normal(shape, 1 / math.sqrt(math.prod(shape[1:])))
    return torch.zeros(shape)

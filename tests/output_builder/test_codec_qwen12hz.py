"""Qwen3-TTS 12 Hz codec decoder: official parity, init, checkpoint I/O and bad inputs (streaming and batching:
test_codec_stream.py).

``tests/fixtures/codec_tiny_official_decode.npz`` was made by the official ``qwen-tts==0.1.1`` package
(transformers 4.57.3, torch 2.13.0 CPU): ``Qwen3TTSTokenizerV2Model.from_pretrained(<speech_tokenizer dir>)``,
then ``model.decode(codes.transpose(1, 2))`` with ``codes = torch.randint(0, 2048, (2, 16, 40),
generator=torch.Generator().manual_seed(0))``; both sdpa and eager attention gave the same waveform.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from output_builder.codecs import CodecConfig, Qwen12HzCodec
from tests.conftest import OFFICIAL_TINY

CODEC_DIR = OFFICIAL_TINY / "speech_tokenizer"
OFFICIAL_NPZ = Path(__file__).resolve().parents[1] / "fixtures" / "codec_tiny_official_decode.npz"
SPF = 1920


@pytest.fixture(scope="module")
def random_codec() -> Qwen12HzCodec:
    return Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=7)


def random_codes(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, shape, generator=torch.Generator().manual_seed(seed))


def test_matches_official_decoder_on_fixture(official: Qwen12HzCodec) -> None:
    ref = np.load(OFFICIAL_NPZ)
    wav = official.decode(torch.from_numpy(ref["codes"]))
    assert wav.dtype == torch.float32 and wav.shape == (2, 40 * SPF)
    np.testing.assert_allclose(wav.numpy(), ref["wav"], rtol=0, atol=1e-4)


def test_fixture_geometry(official: Qwen12HzCodec) -> None:
    assert (official.sample_rate, official.samples_per_frame, official.num_quantizers) == (24000, SPF, 16)


@pytest.mark.bitexact
def test_from_config_is_audible_and_seeded(random_codec: Qwen12HzCodec) -> None:
    codes = random_codes((2, 16, 12), seed=3)
    wav = random_codec.decode(codes)
    rms = wav.pow(2).mean().sqrt().item()
    assert not torch.isnan(wav).any() and wav.abs().max() <= 1.0
    assert 0.05 <= rms <= 0.5
    same = Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=7).decode(codes)
    other = Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=8).decode(codes)
    assert torch.equal(wav, same) and not torch.equal(wav, other)


@pytest.mark.bitexact
def test_save_and_reload_round_trip(random_codec: Qwen12HzCodec, tmp_path: Path) -> None:
    random_codec.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_tts_tokenizer_12hz"
    assert config["encoder_config"]["model_type"] == "mimi"
    assert config["decoder_config"]["sliding_window"] == 72
    assert all(k.startswith("decoder.") for k in load_file(tmp_path / "model.safetensors"))
    reloaded = Qwen12HzCodec.from_pretrained(tmp_path)
    codes = random_codes((1, 16, 6), seed=4)
    assert torch.equal(reloaded.decode(codes), random_codec.decode(codes))


def test_resave_keeps_fixture_template(official: Qwen12HzCodec, tmp_path: Path) -> None:
    official.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((CODEC_DIR / "config.json").read_text())
    assert saved["encoder_config"] == original["encoder_config"]
    assert CodecConfig.from_dict(saved) == CodecConfig.from_dict(original) == official.config


def test_config_dict_round_trip() -> None:
    cfg = CodecConfig.tiny()
    assert CodecConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="decode_upsample_rate"):
        CodecConfig(upsample_rates=(8, 5, 4))


def test_load_errors_name_the_file(random_codec: Qwen12HzCodec, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        Qwen12HzCodec.from_pretrained(tmp_path)
    random_codec.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    state = load_file(weights)
    state["decoder.extra.weight"] = torch.zeros(1)
    del state["decoder.pre_conv.conv.bias"]
    save_file(state, weights)
    with pytest.raises(ValueError, match=r"model\.safetensors.*pre_conv\.conv\.bias.*extra\.weight"):
        Qwen12HzCodec.from_pretrained(tmp_path)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        Qwen12HzCodec.from_pretrained(tmp_path)


def test_bad_inputs_are_rejected(random_codec: Qwen12HzCodec) -> None:
    with pytest.raises(ValueError, match="expected codes"):
        random_codec.decode(random_codes((1, 15, 4), seed=0))
    assert random_codec.decode(random_codes((2, 16, 0), seed=0)).shape == (2, 0)

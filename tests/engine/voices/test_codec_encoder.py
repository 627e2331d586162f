"""The 12 Hz tokenizer's encoder against the official package's codes for the same reference recording."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.voices.codec_encoder import CodecEncoder, load_codec_encoder
from talker.models.qwen3_tts.config import CheckpointError

pytestmark = pytest.mark.bitexact  # exact codes: scripts/test runs them under every CPU capability

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "official"
BASE = FIXTURES / "qwen3-tts-tiny-official-base"


@pytest.fixture(scope="module")
def encoder() -> CodecEncoder:
    loaded = load_codec_encoder(BASE)
    assert loaded is not None
    return loaded


@pytest.fixture(scope="module")
def reference_wav() -> np.ndarray:
    wav, rate = sf.read(FIXTURES / "voice-ref-a.wav", dtype="float32")
    assert rate == 24000 and wav.ndim == 1
    return wav


def test_codes_match_the_official_encoder(encoder: CodecEncoder, reference_wav: np.ndarray) -> None:
    # prompt_ref_code: the official create_voice_clone_prompt's ref_code, i.e. speech_tokenizer.encode(wav, sr=24000)
    with np.load(FIXTURES / "qwen3-tts-tiny-official-base.reference.npz") as ref:
        expected = torch.from_numpy(ref["prompt_ref_code"])
    codes = encoder.encode(reference_wav)
    assert codes.dtype == torch.int64 and codes.device.type == "cpu"
    assert codes.shape == expected.shape == (66, 16)
    assert torch.equal(codes, expected)


def test_constants(encoder: CodecEncoder) -> None:
    assert (encoder.sample_rate, encoder.frame_samples, encoder.num_quantizers) == (24000, 1920, 16)


# (samples, frames) as the official speech_tokenizer.encode returned them: a partial last frame is kept (ceil).
@pytest.mark.parametrize(
    ("samples", "frames"), [(1, 1), (1919, 1), (1920, 1), (1921, 2), (3839, 2), (3840, 2), (3841, 3), (5000, 3)]
)
def test_frame_count_keeps_a_partial_last_frame(
    encoder: CodecEncoder, reference_wav: np.ndarray, samples: int, frames: int
) -> None:
    codes = encoder.encode(reference_wav[:samples])
    assert codes.shape == (frames, 16)


def test_rejects_an_empty_or_multichannel_wav(encoder: CodecEncoder) -> None:
    for bad in (np.zeros(0, np.float32), np.zeros((2, 1920), np.float32)):
        with pytest.raises(ValueError, match="mono waveform"):
            encoder.encode(bad)


def test_none_without_encoder_weights(tiny_dir: Path) -> None:
    # Talkstream's own tiny CustomVoice checkpoint: its tokenizer holds the decoder's tensors only.
    assert load_codec_encoder(tiny_dir) is None


def _broken_copy(tmp_path: Path, drop: str | None = None, **config: object) -> Path:
    """The Base checkpoint's tokenizer (encoder tensors only), less one tensor or with config fields changed."""
    target = tmp_path / "ckpt" / "speech_tokenizer"
    target.mkdir(parents=True)
    source = BASE / "speech_tokenizer"
    with safe_open(str(source / "model.safetensors"), framework="pt") as handle:
        names = [k for k in handle.keys() if k.startswith("encoder.") and k != drop]  # noqa: SIM118
        save_file({k: handle.get_tensor(k) for k in names}, str(target / "model.safetensors"))
    raw = json.loads((source / "config.json").read_text())
    for key, value in config.items():
        if key.startswith("encoder_config."):
            raw["encoder_config"][key.removeprefix("encoder_config.")] = value
        else:
            raw[key] = value
    (target / "config.json").write_text(json.dumps(raw))
    return tmp_path / "ckpt"


def test_an_intact_copy_loads(tmp_path: Path) -> None:
    assert load_codec_encoder(_broken_copy(tmp_path)) is not None  # the helper itself breaks nothing


@pytest.mark.parametrize(
    ("drop", "config", "message"),
    [
        ("encoder.downsample.conv.weight", {}, "missing"),
        (None, {"encoder_config.num_filters": 8}, "do not match"),  # every SEANet conv of another width
        # more codebooks in the file than the config has
        (None, {"encoder_config.num_quantizers": 8, "encoder_valid_num_quantizers": 8}, "unexpected"),
        (None, {"encoder_valid_num_quantizers": 17}, "encoder_valid_num_quantizers"),
        (None, {"encode_downsample_rate": 960}, "encode_downsample_rate"),
        (None, {"encoder_config.hidden_size": "wide"}, "malformed"),
        (None, {"encoder_config": None}, "encoder_config"),
    ],
)
def test_broken_checkpoint_raises(tmp_path: Path, drop: str | None, config: dict[str, object], message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        load_codec_encoder(_broken_copy(tmp_path, drop, **config))


def test_damaged_weights_or_a_stray_encoder_tensor_raise(tmp_path: Path) -> None:
    target = tmp_path / "speech_tokenizer"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="malformed checkpoint file"):
        load_codec_encoder(tmp_path)
    save_file({"encoder.stray.weight": torch.zeros(1)}, str(target / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected encoder tensor encoder\.stray\.weight"):
        load_codec_encoder(tmp_path)


def test_missing_tokenizer_raises(tmp_path: Path) -> None:
    shutil.copytree(BASE / "speech_tokenizer", tmp_path / "speech_tokenizer", ignore=shutil.ignore_patterns("*.json"))
    with pytest.raises(CheckpointError, match="missing checkpoint file"):
        load_codec_encoder(tmp_path)
    with pytest.raises(CheckpointError, match="missing checkpoint file"):
        load_codec_encoder(tmp_path / "nowhere")

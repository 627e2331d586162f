"""The Base checkpoint's speaker encoder against the official x-vector of the same reference voice, its mel
front end against an independent filterbank and a pure tone, and its loader's verdicts on other checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file, save_file
from transformers.audio_utils import mel_filter_bank

from engine.voices import mel
from engine.voices.speaker_encoder import SpeakerEncoder, load_speaker_encoder
from talker.models.qwen3_tts.config import CheckpointError

OFFICIAL = Path(__file__).resolve().parents[2] / "fixtures" / "official"
BASE = OFFICIAL / "qwen3-tts-tiny-official-base"
CUSTOM_VOICE = OFFICIAL / "qwen3-tts-tiny-official-cv"


@pytest.fixture(scope="module")
def encoder() -> SpeakerEncoder:
    enc = load_speaker_encoder(BASE)
    assert enc is not None
    return enc


@pytest.fixture(scope="module")
def voice() -> np.ndarray:
    wav, sr = sf.read(OFFICIAL / "voice-ref-a.wav", dtype="float32")
    assert sr == 24_000 and wav.ndim == 1
    return wav


def test_the_x_vector_matches_the_official_one(encoder: SpeakerEncoder, voice: np.ndarray) -> None:
    reference = np.load(OFFICIAL / "qwen3-tts-tiny-official-base.reference.npz")["prompt_ref_spk_embedding"]
    x = encoder.embed(voice)
    assert x.dtype == torch.float32 and x.device.type == "cpu" and x.shape == (encoder.dim,) == reference.shape
    assert encoder.sample_rate == 24_000
    assert np.abs(x.numpy() - reference).max() < 1e-4


def test_the_filterbank_agrees_with_an_independent_one() -> None:
    ours = mel.mel_filterbank().numpy()  # [128, 513]
    theirs = mel_filter_bank(num_frequency_bins=513, num_mel_filters=128, min_frequency=0.0, max_frequency=12_000.0,
                             sampling_rate=24_000, norm="slaney", mel_scale="slaney").T
    assert ours.shape == theirs.shape == (128, 513) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-8)  # float32 rounding apart
    assert (ours.max(axis=1) > 0).all()  # no empty band: each triangle spans at least one FFT bin


def test_a_pure_tone_lights_the_band_around_its_frequency() -> None:
    t = np.arange(24_000) / 24_000
    tone = torch.from_numpy((0.5 * np.sin(2 * np.pi * 3_000.0 * t)).astype(np.float32)).unsqueeze(0)  # [1, N]
    spec = mel.log_mel(tone)  # [1, 128, T]
    assert spec.shape == (1, 128, mel.frames_for(24_000))
    bank = mel.mel_filterbank().numpy()
    peak_hz = bank.argmax(axis=1) * 24_000 / 1024  # each band's centre, to the nearest FFT bin
    loudest = int(spec[0].mean(dim=1).argmax())
    assert abs(peak_hz[loudest] - 3_000.0) < 50.0


def test_custom_voice_has_no_speaker_encoder() -> None:
    assert load_speaker_encoder(CUSTOM_VOICE) is None


def _speaker_only_checkpoint(tmp_path: Path, edit: str) -> Path:
    shutil.copy(BASE / "config.json", tmp_path / "config.json")
    weights = {k: v for k, v in load_file(BASE / "model.safetensors").items() if k.startswith("speaker_encoder.")}
    if edit == "missing":
        del weights["speaker_encoder.fc.bias"]
    else:
        weights["speaker_encoder.fc.bias"] = torch.zeros(3)
    save_file(weights, tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize(("edit", "message"), [("missing", r"missing \[speaker_encoder\.fc\.bias\]"),
                                               ("reshaped", r"wrong shape \[speaker_encoder\.fc\.bias \(3,\)")])
def test_weights_that_do_not_fit_the_config_are_refused(tmp_path: Path, edit: str, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        load_speaker_encoder(_speaker_only_checkpoint(tmp_path, edit))


def test_the_embedding_is_deterministic_and_takes_any_float_layout(encoder: SpeakerEncoder, voice: np.ndarray) -> None:
    first = encoder.embed(voice)
    assert torch.equal(first, encoder.embed(voice))
    strided = np.repeat(voice.astype(np.float64), 2)[::2]  # the same samples, float64 and not contiguous
    assert torch.equal(first, encoder.embed(strided))


def test_the_shortest_accepted_clip_runs_and_a_shorter_one_is_refused(encoder: SpeakerEncoder,
                                                                       voice: np.ndarray) -> None:
    # the reflect padding of the widest dilated convolution needs 5 mel frames: 1280 samples at these sizes
    assert encoder.min_samples == 1280
    assert torch.isfinite(encoder.embed(voice[:1280])).all()
    with pytest.raises(ValueError, match="too short for the speaker encoder: 1279 samples, need at least 1280"):
        encoder.embed(voice[:1279])
    with pytest.raises(ValueError, match="mono"):
        encoder.embed(np.stack([voice, voice], axis=1))


def test_a_request_error_crosses_a_process_with_its_param_and_code() -> None:
    """Voices are made in a process of their own (engine/voices/clone.py): its refusals keep their fields."""
    import pickle

    from common.request import RequestError

    err = pickle.loads(pickle.dumps(RequestError("no speaker encoder", param="model", code="unsupported_model")))
    assert (err.message, err.param, err.code) == ("no speaker encoder", "model", "unsupported_model")

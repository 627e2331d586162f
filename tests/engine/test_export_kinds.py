"""`talkstream export-tiny --kind`: Base and VoiceDesign checkpoints with random weights load through the real engine,
a Base one clones a voice from a recording with both of its encoders and speaks with it, a VoiceDesign one speaks
what its instructions describe. Tiny sizes only; the real sizes' configs are checked without writing their weights."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from common.request import RequestError, SpeechRequest, VoiceKind
from engine import export_voices
from engine.config import EngineConfig
from engine.engine import Engine
from engine.tiny import TALKER, checkpoint_config, export_tiny
from tests.conftest import VOICE_REF, VOICE_REF_TEXT

HIDDEN = TALKER["hidden_size"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    return {kind: export_tiny(root / kind, kind=kind) for kind in ("base", "voice_design")}


async def started(engine_config: EngineConfig, model: Path) -> Engine:
    engine = Engine(replace(engine_config, model=str(model), max_batch=4, max_queue=4))
    await engine.start()
    return engine


@pytest.fixture
async def base(engine_config: EngineConfig, exported: dict[str, Path]) -> AsyncIterator[Engine]:
    engine = await started(engine_config, exported["base"])
    yield engine
    await engine.stop()


async def speak(engine: Engine, request: SpeechRequest) -> np.ndarray:
    (stream,) = engine.submit_many([request])
    return np.frombuffer(b"".join([bytes(c) async for c in stream]), "<i2")


async def test_a_base_export_clones_a_recording_and_speaks_with_it(base: Engine) -> None:
    wav, _ = sf.read(str(VOICE_REF), dtype="float32")
    assert base.voice_kind is VoiceKind.BASE and base.voices == {}
    prompt = await base.clone_prompt(wav, VOICE_REF_TEXT)
    assert len(prompt.x_vector) == HIDDEN and np.isfinite(prompt.x_vector).all()
    assert prompt.ref_codes is not None
    codes = np.array(prompt.ref_codes)
    assert codes.shape == (-(-len(wav) // export_voices.FRAME_SAMPLES), export_voices.VALID_QUANTIZERS)
    assert len(np.unique(codes)) > 16  # random but scaled weights: the frames are not all one codeword
    x_only = await base.clone_prompt(wav, None)
    assert x_only.ref_codes is None and x_only.x_vector == prompt.x_vector
    for clone in (prompt, x_only):
        pcm = await speak(base, SpeechRequest(text="hello world", clone=clone, seed=1, max_frames=6))
        assert 0 < len(pcm) <= 6 * 1920 and np.abs(pcm).max() > 0


async def test_a_voice_design_export_speaks_its_instructions(engine_config: EngineConfig,
                                                              exported: dict[str, Path]) -> None:
    engine = await started(engine_config, exported["voice_design"])
    try:
        assert engine.voice_kind is VoiceKind.VOICE_DESIGN and "alloy" in engine.voices
        request = SpeechRequest(text="hello world", instructions="A calm, deep voice.", seed=1, max_frames=6)
        pcm = await speak(engine, request)
        assert 0 < len(pcm) <= 6 * 1920 and np.abs(pcm).max() > 0
        with pytest.raises(RequestError, match="cannot clone"):
            await engine.clone_prompt(np.zeros(24000, np.float32), None)
    finally:
        await engine.stop()


def test_the_kinds_differ_in_config_only_where_they_should(exported: dict[str, Path], tiny_dir: Path) -> None:
    """Same Talker weights in every kind; speakers only in CustomVoice (the default, tiny's own checkpoint)."""
    from safetensors import safe_open

    with safe_open(str(tiny_dir / "model.safetensors"), "pt") as custom, \
            safe_open(str(exported["base"] / "model.safetensors"), "pt") as base:
        talker = set(custom.keys())
        assert {k for k in base.keys() if not k.startswith("speaker_encoder.")} == talker  # noqa: SIM118
        for name in ("talker.codec_head.weight", "talker.model.layers.0.mlp.down_proj.weight"):
            assert custom.get_tensor(name).equal(base.get_tensor(name))
    config = checkpoint_config(300)
    assert export_voices.kind_config(config, "custom_voice", "tiny") is config
    for kind in ("base", "voice_design"):
        out = export_voices.kind_config(config, kind, "tiny")
        assert out["tts_model_type"] == kind and out["talker_config"]["spk_id"] == {}
        assert ("speaker_encoder_config" in out) == (kind == "base")
    with pytest.raises(ValueError, match="kind must be one of"):
        export_tiny(Path("unused"), kind="custom")


def test_real_sizes_are_the_official_base_checkpoint_sizes() -> None:
    """The speaker encoder at Qwen3-TTS Base's sizes (its x-vector the Talker's width), the Mimi encoder at the 12 Hz
    tokenizer's: 1920 samples a frame, 32 codebooks of which the first 16 are read."""
    from transformers import MimiConfig

    from engine.tiny import sized

    for size, width in (("0.6b", 1024), ("1.7b", 2048)):
        talker, predictor, _ = sized(size)
        spec = export_voices.kind_config(checkpoint_config(300, talker, predictor), "base", size)
        assert spec["speaker_encoder_config"] == {
            "mel_dim": 128, "enc_dim": width, "enc_channels": [512, 512, 512, 512, 1536],
            "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 128,
            "enc_res2net_scale": 8, "enc_se_channels": 128, "sample_rate": 24000}
    mimi = MimiConfig(**{k: v for k, v in export_voices.MIMI_REAL.items() if k != "model_type"})
    defaults = MimiConfig()
    for key in ("hidden_size", "num_filters", "num_hidden_layers", "num_attention_heads", "num_quantizers",
                "codebook_size", "codebook_dim", "upsampling_ratios", "intermediate_size"):
        assert getattr(mimi, key) == getattr(defaults, key), key
    assert (mimi.frame_size, mimi.frame_rate, mimi.num_quantizers) == (1920, 12.5, 32)

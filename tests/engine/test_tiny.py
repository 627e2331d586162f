import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.tiny import checkpoint_config, ensure_tiny, export_tiny, sized
from frontend.frontend import load_tokenizer
from output_builder.codecs.qwen12hz import Qwen12HzCodec
from talker.models.loader import load_talker
from talker.models.qwen3_tts.config import Qwen3TTSConfig
from talker.models.qwen3_tts.model import Qwen3TTSModel


def test_tiny_is_generated_once_in_the_official_layout(tiny_dir: Path, tiny_cache: Path) -> None:
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "vocab.json",
                 "merges.txt", "tokenizer_config.json", "speech_tokenizer/config.json",
                 "speech_tokenizer/model.safetensors"):
        assert (tiny_dir / name).is_file(), name
    assert ensure_tiny(tiny_cache) == tiny_dir
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["talker_config"]["num_code_groups"] == 16
    assert cfg["talker_config"]["code_predictor_config"]["num_code_groups"] == 16


def test_export_is_deterministic(tmp_path: Path, tiny_dir: Path) -> None:
    export_tiny(tmp_path / "again")
    a = load_talker(tiny_dir, torch.device("cpu"), torch.float32).model.state_dict()
    b = load_talker(tmp_path / "again", torch.device("cpu"), torch.float32).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tokenizer_keeps_the_chat_template_layout(tiny_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_dir)
    ids = tok.assistant("Hello there.")
    start, end, role = tok.ids["<|im_start|>"], tok.ids["<|im_end|>"], tuple(tok.plain("assistant\n"))
    assert tok.tokens("assistant\n") == ["assistant", "Ċ"]
    assert ids[:3] == (start, *role)
    assert ids[-5:] == (end, *tok.plain("\n"), start, *role)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):  # the slow path reads the same tokenizer
        shutil.copy(tiny_dir / name, tmp_path / name)
    assert load_tokenizer(tmp_path).assistant("Hello there.") == ids


def test_tiny_codec_is_audible(tiny_dir: Path) -> None:
    codec = Qwen12HzCodec.from_pretrained(tiny_dir / "speech_tokenizer")
    wave = codec.decode(torch.randint(0, 2048, (1, 16, 12)))[0].numpy()
    rms = float(np.sqrt((wave**2).mean()))
    assert 0.02 < rms < 0.7 and np.isfinite(wave).all()


def test_the_0_6b_size_has_qwen3_tts_0_6b_layers_and_a_valid_config() -> None:
    talker_cfg, predictor_cfg, _ = sized("0.6b")
    cfg = Qwen3TTSConfig.from_dict(checkpoint_config(1000, talker_cfg, predictor_cfg))
    assert (cfg.talker.num_layers, cfg.talker.hidden_size, cfg.talker.num_heads, cfg.talker.num_kv_heads) == (
        28, 1024, 16, 8)
    assert (cfg.predictor.num_layers, cfg.predictor.hidden_size) == (5, 1024)
    assert sum(talker_cfg["rope_scaling"]["mrope_section"]) * 2 == cfg.talker.head_dim == 128


def test_the_1_7b_size_has_qwen3_tts_1_7b_layers_and_a_valid_config() -> None:
    """A 2048-wide Talker over the same 1024-wide code predictor, joined by small_to_mtp_projection."""
    talker_cfg, predictor_cfg, _ = sized("1.7b")
    cfg = Qwen3TTSConfig.from_dict(checkpoint_config(1000, talker_cfg, predictor_cfg))
    assert (cfg.talker.num_layers, cfg.talker.hidden_size, cfg.talker.intermediate_size) == (28, 2048, 6144)
    assert (cfg.predictor.num_layers, cfg.predictor.hidden_size, cfg.text_hidden_size) == (5, 1024, 2048)
    with torch.device("meta"):
        model = Qwen3TTSModel(cfg)
    assert isinstance(model.talker.code_predictor.small_to_mtp_projection, torch.nn.Linear)
    assert model.talker.code_predictor.model.codec_embedding[0].weight.shape == (2048, 2048)
    assert cfg.talker.linear_params > 2 * sized_params("0.6b")


def sized_params(size: str) -> int:
    talker_cfg, predictor_cfg, _ = sized(size)
    return Qwen3TTSConfig.from_dict(checkpoint_config(1000, talker_cfg, predictor_cfg)).talker.linear_params


def test_an_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"size must be one of tiny, 0\.6b, 1\.7b"):
        export_tiny(tmp_path / "x", "7b")

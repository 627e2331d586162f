"""The embedded `tiny` model: a Qwen3-TTS checkpoint with a tiny config and seeded random weights.

It is generated on first use into a cache directory in the official layout, then loaded through the same loader as
a real checkpoint. The audio is noise, but every part of the real path runs. A few weights are set by hand so that
the Talker ends its audio (EOS) soon after the text runs out, as a trained model does.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from torch import nn

from common.portable_random import PortableRandom
from engine.export_voices import check_kind, kind_config, kind_weights, write_speech_tokenizer
from output_builder.codecs import CodecConfig, Qwen12HzCodec
from talker.models.qwen3_tts.config import Qwen3TTSConfig
from talker.models.qwen3_tts.model import Qwen3TTSModel

TINY_VERSION = 2  # 2: CPU-independent draws (common/portable_random.py)
SEED = 1234
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>")
SPEAKERS = {"aria": 3061, "ben": 3062, "cleo": 3063, "dev": 3064}
WORDS = [
    "assistant", "user", "the", "and", "of", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "hot", "word", "but",
    "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said",
    "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them",
    "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look",
    "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know",
    "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "hello", "world",
    "speech", "voice", "audio", "stream", "talk", "test", "tiny", "quick", "brown", "fox", "jumps", "lazy", "dog"
]

TALKER = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "vocab_size": 3072,
    "max_position_embeddings": 4096,
    "hidden_act": "silu",
    "attention_bias": False,
    "num_code_groups": 16,
    "rope_scaling": {"interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_pad_id": 2148,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
    "codec_language_id": {"english": 2050, "chinese": 2055},
    "spk_id": SPEAKERS,
    "spk_is_dialect": dict.fromkeys(SPEAKERS, False),
    "model_type": "qwen3_tts_talker",
}
PREDICTOR = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "vocab_size": 2048,
    "num_code_groups": 16,
    "max_position_embeddings": 64,
    "hidden_act": "silu",
    "attention_bias": False,
    "layer_types": ["full_attention"],
    "model_type": "qwen3_tts_talker_code_predictor",
}
CODEC = {
    "codebook_size": 2048,
    "codebook_dim": 32,
    "num_quantizers": 16,
    "latent_dim": 32,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "sliding_window": 72,
    "max_position_embeddings": 8000,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-5,
    "layer_scale_initial_scale": 0.01,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 64,
}
_LAYER_0_6B = {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8,
               "head_dim": 128}
_MROPE = {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"}
_PREDICTOR_REAL = {**_LAYER_0_6B, "num_hidden_layers": 5, "layer_types": ["full_attention"] * 5}
_CODEC_REAL = {"codebook_dim": 512, "latent_dim": 1024, "hidden_size": 512, "intermediate_size": 1024,
               "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
               "decoder_dim": 1536}
# the real checkpoints' layer sizes (random weights, the tiny tokenizer); both project 2048-wide text embeddings
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {},
    "0.6b": {
        "talker": {**_LAYER_0_6B, "num_hidden_layers": 28, "rope_scaling": _MROPE, "text_hidden_size": 2048},
        "predictor": _PREDICTOR_REAL,
        "codec": _CODEC_REAL,
    },
    "1.7b": {
        "talker": {**_LAYER_0_6B, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "rope_scaling": _MROPE, "text_hidden_size": 2048},
        "predictor": _PREDICTOR_REAL,
        "codec": _CODEC_REAL,
    },
}
GENERATION = {
    "do_sample": True,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 0.9,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9,
    "max_new_tokens": 8192,
    "non_streaming_mode": False,  # the EOS wiring below needs the text fed one token per frame
}


def fingerprint() -> str:
    blob = json.dumps([TINY_VERSION, SEED, SPEAKERS, WORDS, TALKER, PREDICTOR, CODEC], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_tiny(cache_dir: Path) -> Path:
    """The tiny checkpoint's directory, generated on first use (atomically, so concurrent starts are safe)."""
    target = cache_dir / f"tiny-{fingerprint()}"
    if (target / "config.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=cache_dir))
    try:
        export_tiny(tmp)
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def sized(size: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The Talker, code predictor and codec configs of a size in SIZES."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    talker, predictor, codec = ({**base, **SIZES[size].get(part, {})} for part, base in
                                (("talker", TALKER), ("predictor", PREDICTOR), ("codec", CODEC)))
    return talker, predictor, codec


def export_tiny(directory: Path, size: str = "tiny", kind: str = "custom_voice") -> Path:
    """Write the tiny checkpoint to `directory` in the official layout; `size` "0.6b" or "1.7b" gives it the layer
    sizes of Qwen3-TTS-12Hz-0.6B or -1.7B (random weights, the tiny tokenizer), for benchmarks at real sizes; `kind`
    "base" or "voice_design" writes that kind of checkpoint (engine/export_voices.py) with the same Talker."""
    talker_cfg, predictor_cfg, codec_cfg = sized(size)
    check_kind(kind)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_tokenizer_files(directory, tokenizer)
    config = kind_config(checkpoint_config(tokenizer.get_vocab_size(), talker_cfg, predictor_cfg), kind, size)
    _dump(directory / "config.json", config)
    _dump(directory / "generation_config.json", GENERATION)
    model = init_weights(Qwen3TTSConfig.from_dict(config))
    state = {k: v.contiguous() for k, v in model.state_dict().items()} | kind_weights(config)
    save_file(state, str(directory / "model.safetensors"))
    codec = Qwen12HzCodec.from_config(CodecConfig.from_dict(codec_cfg), seed=SEED + 1)
    write_speech_tokenizer(codec, directory / "speech_tokenizer", kind, size)
    return directory


def checkpoint_config(text_vocab: int, talker_cfg: dict[str, Any] = TALKER,
                      predictor_cfg: dict[str, Any] = PREDICTOR) -> dict[str, Any]:
    talker = dict(talker_cfg, text_vocab_size=text_vocab,
                  text_hidden_size=talker_cfg.get("text_hidden_size", talker_cfg["hidden_size"]))
    talker["code_predictor_config"] = predictor_cfg
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_type": "custom_voice",
        "tts_model_size": "tiny",
        "im_start_token_id": 1,
        "im_end_token_id": 2,
        "tts_pad_token_id": 3,
        "tts_bos_token_id": 4,
        "tts_eos_token_id": 5,
        "talker_config": talker,
        "dtype": "float32",
    }


@torch.no_grad()
def init_weights(cfg: Qwen3TTSConfig) -> Qwen3TTSModel:
    """Every parameter is set here (the module is built on the meta device), from draws that are the same bits on
    every CPU: the oracle fixtures are checked against this checkpoint's hash."""
    with torch.device("meta"):
        model = Qwen3TTSModel(cfg)
    model.to_empty(device="cpu")
    draws = PortableRandom(SEED)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif p.ndim >= 2:
            p.copy_(draws.normal(p.shape, 0.02 if "embedding" not in name else 1.0))
        else:
            p.zero_()
    _wire_eos_on_pad(model, cfg)
    return model


def _wire_eos_on_pad(model: Qwen3TTSModel, cfg: Qwen3TTSConfig) -> None:
    """Hidden channel 0 carries "the text has run out": only the tts_pad text embedding writes it, no layer
    touches it, and the codec head reads it into the EOS logit."""
    t = model.talker
    z = cfg.text_hidden_size - 1  # a text-embedding channel reserved for the flag
    t.model.text_embedding.weight[:, z] = 0.0
    t.model.text_embedding.weight[cfg.text.tts_pad, z] = 4.0
    fc1, fc2, head = t.text_projection.linear_fc1, t.text_projection.linear_fc2, t.codec_head
    assert isinstance(fc1, nn.Linear) and isinstance(fc2, nn.Linear) and isinstance(head, nn.Linear)
    fc1.weight[:, z] = 0.0
    fc1.weight[0].zero_()
    fc1.weight[0, z] = 2.0
    fc2.weight[0].zero_()
    fc2.weight[:, 0] = 0.0
    fc2.weight[0, 0] = 8.0
    t.model.codec_embedding.weight[:, 0] = 0.0
    for emb in t.code_predictor.model.codec_embedding:
        assert isinstance(emb, torch.nn.Embedding)
        emb.weight[:, 0] = 0.0
    for layer in t.model.layers:
        layer.self_attn.o_proj.weight[0].zero_()  # type: ignore[union-attr,index]
        layer.mlp.down_proj.weight[0].zero_()  # type: ignore[union-attr,index]
    head.weight[:, 0] = 0.0
    head.weight[cfg.codec.eos].zero_()
    head.weight[cfg.codec.eos, 0] = 8.0


def build_tokenizer() -> Tokenizer:
    """A byte-level BPE of under 1,000 entries, deterministic, with the Qwen chat and TTS special tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab.setdefault(ch, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        for form in (word, "Ġ" + word):
            for i in range(2, len(form) + 1):
                left, right = form[: i - 1], form[i - 1]
                if form[:i] not in vocab:
                    vocab[form[:i]] = len(vocab)
                    merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def _write_tokenizer_files(directory: Path, tok: Tokenizer) -> None:
    vocab = tok.get_vocab()  # the special tokens too, at their ids, as in the official checkpoints' vocab.json
    _dump(directory / "vocab.json", dict(sorted(vocab.items(), key=lambda kv: kv[1])))
    merges = json.loads(tok.to_str())["model"]["merges"]
    lines = [" ".join(m) if isinstance(m, list) else m for m in merges]
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    _dump(
        directory / "tokenizer_config.json",
        {
            "added_tokens_decoder": added,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "clean_up_tokenization_spaces": False,
            "model_max_length": 131072,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
            "errors": "replace",
            "split_special_tokens": False,
        },
    )


def _dump(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")

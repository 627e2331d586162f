"""Qwen3-ForcedAligner: a Qwen3-ASR model whose head classifies time, read from the released checkpoint's layout.

One forward pass aligns a transcript to a clip: the clip's audio tokens (from the audio encoder) sit between
`<|audio_start|>` and `<|audio_end|>`, then the words follow, each followed by two `<timestamp>` tokens; the head's
argmax at each `<timestamp>` is a time class of `segment_ms` (80 ms), the start and the end of the word.

The arithmetic is the official package's (qwen-asr 0.0.6, transformers backend, on a CPU):
- audio encoder: the features cut into chunks of 100 frames, each through three stride-2 convolutions (GELU), a
  projection and a sinusoidal position (restarting in each chunk), so 13 tokens a full chunk; then the encoder layers
  over all of the clip's tokens at once (the official CPU path attends across the whole clip: its window lengths only
  reach flash attention), a final norm and a two-layer projection to the decoder's width;
- decoder: a Qwen3 stack (the Talker's own layers, `talker/models/qwen3_tts/layers.py`), causal, positions 0..L-1
  (the multimodal RoPE with equal positions is plain RoPE), then the `classify_num`-way head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from talker.models.loader import read_weights
from talker.models.qwen3_tts.config import CheckpointError, DecoderArch, read_json
from talker.models.qwen3_tts.layers import DecoderStack, embedding, sdpa

CHUNK = 100  # mel frames per encoder chunk (2 × n_window)
TOKENS_PER_CHUNK = 13  # a full chunk's audio tokens: 100 → 50 → 25 → 13


@dataclass(frozen=True, slots=True)
class EncoderArch:
    mel_bins: int
    width: int  # d_model
    layers: int
    heads: int
    ffn: int
    conv: int  # downsample_hidden_size
    output: int  # output_dim: the decoder's width
    positions: int  # max_source_positions

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EncoderArch:
        return cls(int(d.get("num_mel_bins", 128)), int(d["d_model"]), int(d["encoder_layers"]),
                   int(d["encoder_attention_heads"]), int(d["encoder_ffn_dim"]), int(d["downsample_hidden_size"]),
                   int(d["output_dim"]), int(d.get("max_source_positions", 1500)))


@dataclass(frozen=True, slots=True)
class AlignerConfig:
    encoder: EncoderArch
    decoder: DecoderArch
    classes: int  # classify_num
    audio_start: int
    audio_end: int
    audio_pad: int
    timestamp: int
    segment_ms: float
    languages: tuple[str, ...]

    @classmethod
    def load(cls, directory: Path) -> AlignerConfig:
        cfg = read_json(directory / "config.json")
        thinker = cfg.get("thinker_config")
        if cfg.get("model_type") != "qwen3_asr" or not isinstance(thinker, dict) or "classify_num" not in thinker:
            raise CheckpointError(f"{directory} is not a Qwen3-ForcedAligner checkpoint (config.json has no "
                                  "thinker_config.classify_num)")
        try:
            return cls(EncoderArch.from_dict(thinker["audio_config"]), DecoderArch.from_dict(thinker["text_config"]),
                       int(thinker["classify_num"]), int(thinker["audio_start_token_id"]),
                       int(thinker["audio_end_token_id"]), int(thinker["audio_token_id"]),
                       int(cfg["timestamp_token_id"]), float(cfg.get("timestamp_segment_time", 80)),
                       tuple(str(x) for x in cfg.get("support_languages", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"malformed aligner config in {directory}: {exc!r}") from exc


def is_aligner(directory: Path) -> bool:
    """Whether `directory` holds a Qwen3-ASR-style checkpoint (a thinker), not a Qwen3-TTS one (a talker)."""
    try:
        return "thinker_config" in read_json(directory / "config.json")
    except CheckpointError:
        return False


def checked(directory: Path) -> Path:
    """`directory` if it holds a forced aligner's files; else an error that says which are missing."""
    names = ("config.json", "preprocessor_config.json", "vocab.json", "merges.txt")
    missing = [name for name in names if not (directory / name).is_file()]
    if not any(directory.glob("model*.safetensors")):
        missing.append("model.safetensors")
    if missing:
        raise CheckpointError(f"{directory} is not a Qwen3-ForcedAligner checkpoint: missing {', '.join(missing)}")
    return directory


def audio_tokens(frames: int) -> int:
    """Audio tokens of a clip of `frames` mel frames (13 per full chunk; a partial chunk's through 3 halvings)."""
    tail = frames % CHUNK
    for _ in range(3):
        tail = (tail - 1) // 2 + 1 if tail > 0 else 0
    return frames // CHUNK * TOKENS_PER_CHUNK + tail


def sinusoids(length: int, channels: int) -> Tensor:
    scale = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-scale * torch.arange(channels // 2).float())
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)  # [P, C]


class EncoderAttention(nn.Module):
    """Every token of the clip attends to every other."""

    def __init__(self, a: EncoderArch) -> None:
        super().__init__()
        self.heads = a.heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(a.width, a.width) for _ in range(3))
        self.out_proj = nn.Linear(a.width, a.width)

    def forward(self, x: Tensor) -> Tensor:
        # x: [T, W]
        t, w = x.shape
        q, k, v = (p(x).view(t, self.heads, -1).transpose(0, 1)[None] for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(sdpa(q, k, v)[0].transpose(0, 1).reshape(t, w))


class EncoderLayer(nn.Module):
    def __init__(self, a: EncoderArch) -> None:
        super().__init__()
        self.self_attn = EncoderAttention(a)
        self.self_attn_layer_norm = nn.LayerNorm(a.width)
        self.fc1 = nn.Linear(a.width, a.ffn)
        self.fc2 = nn.Linear(a.ffn, a.width)
        self.final_layer_norm = nn.LayerNorm(a.width)

    def forward(self, x: Tensor) -> Tensor:
        # x: [T, W]
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    def __init__(self, a: EncoderArch) -> None:
        super().__init__()
        self.conv2d1 = nn.Conv2d(1, a.conv, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(a.conv, a.conv, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(a.conv, a.conv, 3, 2, padding=1)
        bins = a.mel_bins
        for _ in range(3):
            bins = (bins + 1) // 2
        self.conv_out = nn.Linear(a.conv * bins, a.width, bias=False)
        self.layers = nn.ModuleList([EncoderLayer(a) for _ in range(a.layers)])
        self.ln_post = nn.LayerNorm(a.width)
        self.proj1 = nn.Linear(a.width, a.width)
        self.proj2 = nn.Linear(a.width, a.output)
        self.positions: Tensor = sinusoids(a.positions, a.width)  # [P, W], rebuilt after a load on "meta"

    def forward(self, features: Tensor) -> Tensor:
        # features: [M, F] one clip → [T, O] its audio tokens
        frames = features.shape[1]
        lengths = [CHUNK] * (frames // CHUNK) + ([frames % CHUNK] if frames % CHUNK else [])
        chunks = nn.utils.rnn.pad_sequence(list(features.T.split(lengths)), batch_first=True)  # [C, 100, M]
        x = chunks.transpose(1, 2).unsqueeze(1)  # [C, 1, M, 100]
        x = F.gelu(self.conv2d3(F.gelu(self.conv2d2(F.gelu(self.conv2d1(x))))))  # [C, D, M/8, 13]
        c, d, m, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(c, t, d * m)) + self.positions[:t]  # [C, 13, W]
        keep = torch.tensor([audio_tokens(n) for n in lengths])
        x = x[torch.arange(t)[None, :] < keep[:, None]]  # [T, W]: each chunk's real tokens, in order
        for layer in self.layers:
            x = layer(x)
        return self.proj2(F.gelu(self.proj1(self.ln_post(x))))


class _Causal:
    """The decoder's attention store for one whole pass: no cache, causal within each row, padding masked."""

    def __init__(self, mask: Tensor | None) -> None:
        self.mask = mask  # [B, 1, L, L] bool, or None: causal

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return sdpa(q, k, v, self.mask, causal=self.mask is None)


class ForcedAligner(nn.Module):
    def __init__(self, cfg: AlignerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.audio_tower = AudioEncoder(cfg.encoder)
        self.embed_tokens = embedding(cfg.decoder.vocab_size, cfg.decoder.hidden_size)
        self.model = DecoderStack(cfg.decoder)
        self.lm_head = nn.Linear(cfg.decoder.hidden_size, cfg.classes, bias=False)

    @classmethod
    def load(cls, directory: Path) -> ForcedAligner:
        cfg = AlignerConfig.load(directory)
        with torch.device("meta"):
            model = cls(cfg)
        state = {_our_name(k): v.float() for k, v in read_weights(directory).items()}
        missing = set(model.state_dict()) - set(state)
        if missing:
            raise CheckpointError(f"the aligner checkpoint in {directory} lacks {len(missing)} weights, e.g. "
                                  f"{sorted(missing)[0]}")
        model.load_state_dict(state, strict=False, assign=True)
        model.audio_tower.positions = sinusoids(cfg.encoder.positions, cfg.encoder.width)
        return model.eval()

    def to_device(self, device: torch.device) -> ForcedAligner:
        self.to(device)
        self.audio_tower.positions = self.audio_tower.positions.to(device)  # not a buffer: not in the checkpoint
        return self

    @torch.inference_mode()
    def classes(self, ids: list[list[int]], audio: list[Tensor]) -> list[Tensor]:
        """ids: each row's prompt (its audio run as `audio_pad` ids), audio: each row's [T, H] audio tokens →
        each row's argmax class at its `<timestamp>` slots."""
        width = max(len(r) for r in ids)
        pad = [width - len(r) for r in ids]  # padded on the left, as the official processor does
        tokens = torch.tensor([[0] * p + r for p, r in zip(pad, ids, strict=True)])  # [B, L]
        x = self.embed_tokens(tokens)  # [B, L, H]
        slots = tokens == self.cfg.audio_pad
        for row, (p, a) in enumerate(zip(pad, audio, strict=True)):
            slots[row, :p] = False
            x[row][slots[row]] = a.to(x.dtype)
        positions = (torch.arange(width)[None, :] - torch.tensor(pad)[:, None]).clamp(min=0)  # [B, L]
        mask = None
        if any(pad):
            real = torch.arange(width)[None, :] >= torch.tensor(pad)[:, None]  # [B, L]
            mask = torch.ones(width, width, dtype=torch.bool).tril()[None, None] & real[:, None, None, :]
            mask = mask | torch.eye(width, dtype=torch.bool)[None, None]  # a padding row attends to itself
        h = self.model.run(x, positions, _Causal(mask), width)
        best = self.lm_head(h).argmax(-1)  # [B, L]
        return [best[row][tokens[row] == self.cfg.timestamp] for row in range(len(ids))]


def _our_name(key: str) -> str:
    """thinker.audio_tower.* → audio_tower.*, thinker.model.embed_tokens → embed_tokens, thinker.model.* → model.*"""
    key = key.removeprefix("thinker.")
    return key.removeprefix("model.") if key.startswith("model.embed_tokens") else key


def checkpoint_name(ours: str) -> str:
    """The released checkpoint's name of one of our weights (`_our_name`'s inverse)."""
    return "thinker." + ("model." + ours if ours.startswith("embed_tokens") else ours)

"""Qwen3-TTS Talker and code predictor modules. Attribute names follow the official checkpoint, so its
`model.safetensors` loads unchanged (`talker.model.layers.0.self_attn.q_proj.weight`, ...)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from talker.models.qwen3_tts.config import Qwen3TTSConfig
from talker.models.qwen3_tts.layers import DecoderStack, KVStore, embedding


class ResizeMLP(nn.Module):
    def __init__(self, inp: int, mid: int, out: int) -> None:
        super().__init__()
        self.linear_fc1: nn.Module = nn.Linear(inp, mid, bias=True)  # nn.Linear, or Int8Linear once quantized
        self.linear_fc2: nn.Module = nn.Linear(mid, out, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerBackbone(DecoderStack):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__(cfg.talker)
        self.codec_embedding = embedding(cfg.talker.vocab_size, cfg.talker.hidden_size)
        self.text_embedding = embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class CodePredictorModel(DecoderStack):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__(cfg.predictor)
        groups = cfg.num_code_groups - 1
        self.codec_embedding = nn.ModuleList(
            [embedding(cfg.predictor.vocab_size, cfg.talker.hidden_size) for _ in range(groups)]
        )


class CodePredictor(nn.Module):
    """Generates the residual codebooks 1..G-1 of a frame from the Talker's hidden state and codebook 0."""

    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        self.model = CodePredictorModel(cfg)
        groups = cfg.num_code_groups - 1
        self.lm_head = nn.ModuleList(
            [nn.Linear(cfg.predictor.hidden_size, cfg.predictor.vocab_size, bias=False) for _ in range(groups)]
        )
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(cfg.talker.hidden_size, cfg.predictor.hidden_size, bias=True)
            if cfg.predictor.hidden_size != cfg.talker.hidden_size
            else nn.Identity()
        )


class Talker(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerBackbone(cfg)
        self.text_projection = ResizeMLP(cfg.text_hidden_size, cfg.text_hidden_size, cfg.talker.hidden_size)
        self.codec_head: nn.Module = nn.Linear(cfg.talker.hidden_size, cfg.talker.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg)

    def embed_text(self, ids: Tensor) -> Tensor:
        # ids: [...] -> [..., H]
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: Tensor) -> Tensor:
        return self.model.codec_embedding(ids)

    def embed_frames(self, codes: Tensor) -> Tensor:
        """codes: [F, G] -> [F, H], each frame's codebook embeddings summed (what a generated frame feeds back)."""
        tables = [self.model.codec_embedding, *self.code_predictor.model.codec_embedding]
        return torch.stack([table(codes[:, g]) for g, table in enumerate(tables)], dim=1).sum(dim=1)

    def backbone(self, x: Tensor, positions: Tensor, kv: KVStore, max_position: int) -> Tensor:
        # x: [B, T, H], positions: [B, T] -> hidden [B, T, H]
        return self.model.run(x, positions, kv, max_position)


class Qwen3TTSModel(nn.Module):
    """The checkpoint root (`talker.*`). A Base model's speaker encoder is not loaded."""

    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        self.talker = Talker(cfg)

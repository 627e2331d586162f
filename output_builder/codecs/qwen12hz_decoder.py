"""The Qwen3-TTS 12 Hz codec decoder as one module (codes -> waveform), and the seeded init of its tiny models."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from common.portable_random import PortableRandom, coarse
from output_builder.codecs.qwen12hz_config import CodecConfig
from output_builder.codecs.qwen12hz_layers import (
    CausalConv1d,
    CausalTransConv1d,
    Codebook,
    ConvNeXtBlock,
    DecoderBlock,
    LayerScale,
    ResidualUnit,
    SlidingTransformer,
    SnakeBeta,
    SplitResidualVQ,
)

PRE_CONV_KERNEL = 3
WAVE_CONV_KERNEL = 7


class Qwen12HzDecoder(nn.Module):
    """The official ``Qwen3TTSTokenizerV2Decoder`` with the same parameter names, written for inference."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitResidualVQ(cfg.num_quantizers, cfg.codebook_size, cfg.codebook_dim)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, PRE_CONV_KERNEL)
        self.pre_transformer = SlidingTransformer(cfg)
        dim = cfg.latent_dim
        self.upsample = nn.Sequential(
            *(
                nn.Sequential(CausalTransConv1d(dim, dim, r, r), ConvNeXtBlock(dim))
                for r in cfg.upsampling_ratios
            )
        )
        widths = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        stages: list[nn.Module] = [CausalConv1d(dim, widths[0], WAVE_CONV_KERNEL)]
        stages += [DecoderBlock(widths[i], widths[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
        stages += [SnakeBeta(widths[-1]), CausalConv1d(widths[-1], 1, WAVE_CONV_KERNEL)]
        self.decoder = nn.Sequential(*stages)

    def synthesize(self, codes: Tensor) -> Tensor:
        """Unclamped waveform. codes: [B, Q, T] -> [B, T * upsample]."""
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"expected codes [B, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")
        h = self.pre_conv(self.quantizer.decode(codes))  # h: [B, latent, T]
        h = self.pre_transformer(h.transpose(1, 2)).transpose(1, 2)
        return self.decoder(self.upsample(h)).squeeze(1)  # [B, 1, T * upsample] -> [B, T * upsample]

    def forward(self, codes: Tensor) -> Tensor:
        # codes: [B, Q, T] int64 -> wav: [B, T * upsample] in [-1, 1]
        return self.synthesize(codes).clamp(-1.0, 1.0)


_TARGET_RMS = 0.15


@torch.no_grad()
def init_audible_(module: Qwen12HzDecoder, seed: int) -> None:
    """Seeded random init that makes the decoder produce noise at RMS ~0.15 instead of near-silence. The same bits
    on every CPU (the tiny checkpoint's hash is part of the oracle fixtures): CPU-independent draws, and the
    loudness factor, measured by a forward pass, is rounded coarsely before it scales the output conv."""
    draws = PortableRandom(seed)
    for sub in module.modules():
        _init_one(sub, draws)
    for sub in module.modules():
        if isinstance(sub, ResidualUnit):
            sub.conv2.conv.weight.mul_(0.25)
    cfg = module.cfg
    codes = draws.integers(cfg.codebook_size, (2, cfg.num_quantizers, 16))
    final = module.synthesize(codes)
    rms = final.pow(2).mean().sqrt().item()
    gain = coarse(_TARGET_RMS / max(rms, 1e-8))
    out_conv = _last_conv(module)
    out_conv.weight.mul_(gain)
    if out_conv.bias is not None:
        out_conv.bias.mul_(gain)


def _normal_(param: Tensor, std: float, draws: PortableRandom) -> None:
    param.copy_(draws.normal(param.shape, std))


def _init_one(sub: nn.Module, draws: PortableRandom) -> None:
    # 1 / sqrt(n), not n ** -0.5: sqrt is correctly rounded everywhere, libm's pow need not be
    if isinstance(sub, Codebook):
        sub.cluster_usage.fill_(1.0)
        _normal_(sub.embedding_sum, 1.0, draws)
    elif isinstance(sub, nn.Conv1d):
        _normal_(sub.weight, 1 / math.sqrt(sub.weight[0].numel()), draws)
    elif isinstance(sub, nn.ConvTranspose1d):
        fan_in = sub.weight.shape[0] * sub.weight.shape[2] / sub.stride[0]
        _normal_(sub.weight, 1 / math.sqrt(fan_in), draws)
    elif isinstance(sub, nn.Linear):
        _normal_(sub.weight, 1 / math.sqrt(sub.weight.shape[1]), draws)
    elif isinstance(sub, SnakeBeta):
        _normal_(sub.alpha, 0.1, draws)
        sub.beta.zero_()
    elif isinstance(sub, LayerScale):
        sub.scale.fill_(0.3)
    elif isinstance(sub, ConvNeXtBlock):
        sub.gamma.fill_(0.3)
    if isinstance(sub, nn.Conv1d | nn.ConvTranspose1d | nn.Linear) and sub.bias is not None:
        sub.bias.zero_()


def _last_conv(module: Qwen12HzDecoder) -> nn.Conv1d:
    convs = [m for m in module.modules() if isinstance(m, nn.Conv1d)]
    return convs[-1]

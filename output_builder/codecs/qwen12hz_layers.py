"""Building blocks of the Qwen3-TTS 12 Hz codec decoder.

Submodule and parameter names follow the official checkpoint layout so that its ``decoder.*`` tensors load
with strict key matching. Every convolution is causal: an output sample never depends on a later input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from output_builder.codecs.qwen12hz_config import CodecConfig

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "silu": nn.SiLU,
    "gelu": nn.GELU,
    "relu": nn.ReLU,
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
}


def make_activation(name: str) -> nn.Module:
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; known: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


class CausalConv1d(nn.Module):
    """Stride-1 convolution padded on the left only, so output length equals input length."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel_size, dilation=dilation, groups=groups)
        self.left_pad = self.reach(kernel_size, dilation)

    @staticmethod
    def reach(kernel_size: int, dilation: int = 1) -> int:
        """How many earlier input samples one output sample sees."""
        return (kernel_size - 1) * dilation

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C_in, T] -> [B, C_out, T]
        return self.conv(F.pad(x, (self.left_pad, 0)))


class CausalTransConv1d(nn.Module):
    """Transposed convolution upsampling by ``stride``; the tail that spills past T * stride is dropped."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel_size, stride=stride)
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C_in, T] -> [B, C_out, T * stride]
        return self.conv(x)[..., : x.shape[-1] * self.stride]


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, with per-channel log-scale alpha and beta."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C, T]
        alpha = self.alpha.exp()[None, :, None]
        inv_beta = 1.0 / (self.beta.exp()[None, :, None] + 1e-9)
        return x + inv_beta * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    kernel_size = 7

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, self.kernel_size, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C, T]
        h = self.dwconv(x).transpose(1, 2)  # h: [B, T, C]
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    kernel_size = 7

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, self.kernel_size, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C, T]
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    """Snake, then x``rate`` transposed-conv upsampling halving the channels, then dilated residual units."""

    dilations = (1, 3, 9)

    def __init__(self, c_in: int, c_out: int, rate: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [SnakeBeta(c_in), CausalTransConv1d(c_in, c_out, 2 * rate, rate)]
        layers += [ResidualUnit(c_out, d) for d in self.dilations]
        self.block = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C_in, T] -> [B, C_out, T * rate]
        for layer in self.block:
            x = layer(x)
        return x


class Codebook(nn.Module):
    """EMA codebook stored as running sums; an entry is ``embedding_sum / max(cluster_usage, eps)``."""

    def __init__(self, size: int, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self.eps = eps

    def lookup(self, codes: Tensor) -> Tensor:
        # codes: [B, T] -> [B, T, D]
        usage = self.cluster_usage.clamp(min=self.eps)[:, None]
        return F.embedding(codes, self.embedding_sum) / F.embedding(codes, usage)


class _VQLayer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, n_q: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VQLayer(size, dim) for _ in range(n_q)])


class ResidualVQ(nn.Module):
    """Sum of ``n_q`` codebook lookups followed by a 1x1 projection. ``input_proj`` is encoder-only."""

    def __init__(self, n_q: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _VQStack(n_q, size, dim)

    def decode(self, codes: Tensor) -> Tensor:
        # codes: [B, n_q, T] -> [B, io_dim, T]
        summed: Tensor | None = None
        for q, layer in enumerate(self.vq.layers):
            emb = cast(_VQLayer, layer)._codebook.lookup(codes[:, q])
            summed = emb if summed is None else summed + emb
        assert summed is not None
        return self.output_proj(summed.transpose(1, 2))


class SplitResidualVQ(nn.Module):
    """One semantic quantizer (``rvq_first``) plus the acoustic rest (``rvq_rest``), projected separately."""

    def __init__(self, n_q: int, size: int, io_dim: int) -> None:
        super().__init__()
        if n_q < 2:
            raise ValueError(f"num_quantizers must be at least 2, got {n_q}")
        self.rvq_first = ResidualVQ(1, size, io_dim // 2, io_dim)
        self.rvq_rest = ResidualVQ(n_q - 1, size, io_dim // 2, io_dim)

    def decode(self, codes: Tensor) -> Tensor:
        # codes: [B, Q, T] -> [B, io_dim, T]
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # x: [..., D]
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


def sliding_causal_mask(length: int, window: int, device: torch.device) -> Tensor:
    """[T, T] bool, True where query t may attend key s: ``t - window < s <= t``."""
    pos = torch.arange(length, device=device)
    delta = pos[:, None] - pos[None, :]
    return (delta >= 0) & (delta < window)


def rotary_tables(length: int, head_dim: int, theta: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin tables, each [T, head_dim], for positions 0..T-1 (computed in float32)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    angles = torch.arange(length, device=device).float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [B, H, T, D]; cos, sin: [T, D]
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class Attention(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        # x: [B, T, heads * D] -> [B, heads, T, D]
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor) -> Tensor:
        # x: [B, T, hidden]; mask: [T, T] bool
        cos, sin = (t.to(x.dtype) for t in rope)
        q = _rotate(self._split(self.q_proj(x), self.heads), cos, sin)
        k = _rotate(self._split(self.k_proj(x), self.kv_heads), cos, sin)
        v = self._split(self.v_proj(x), self.kv_heads)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class GatedMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.act_fn = make_activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        dim = cfg.hidden_size
        self.input_layernorm = RMSNorm(dim, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.self_attn_layer_scale = LayerScale(dim, cfg.layer_scale_initial_scale)
        self.post_attention_layernorm = RMSNorm(dim, cfg.rms_norm_eps)
        self.mlp = GatedMLP(dim, cfg.intermediate_size, cfg.hidden_act)
        self.mlp_layer_scale = LayerScale(dim, cfg.layer_scale_initial_scale)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor) -> Tensor:
        # x: [B, T, hidden]
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rope, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class SlidingTransformer(nn.Module):
    """Causal sliding-window transformer over frames, mapping latent_dim -> latent_dim."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.window, self.head_dim, self.theta = cfg.sliding_window, cfg.head_dim, cfg.rope_theta
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, T, latent] -> [B, T, latent]
        length, device = x.shape[1], x.device
        rope = rotary_tables(length, self.head_dim, self.theta, device)
        mask = sliding_causal_mask(length, self.window, device)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, rope, mask)
        return self.output_proj(self.norm(h))

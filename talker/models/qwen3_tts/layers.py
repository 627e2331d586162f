"""Qwen3-style decoder layers (q/k RMSNorm, GQA, SwiGLU, RoPE), written for batched decode.

Attention is delegated to a KV store, so the same layers serve the Talker (slot KV cache, each slot with its own
length) and the code predictor (a small dense cache shared by the whole batch).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from talker.models.qwen3_tts.config import DecoderArch
from talker.models.qwen3_tts.linear import Projection, dense


class KVStore(Protocol):
    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store k/v for the current tokens and attend.

        q: [B, Hq, T, D], k/v: [B, Hkv, T, D] -> [B, Hq, T, D]
        """
        ...


def embedding(count: int, width: int) -> nn.Embedding:
    """An embedding table left uninitialised: its weights are always loaded (built on "meta", a random init would
    import torch._dynamo for its meta kernel: 2.5 s of every process start)."""
    return nn.Embedding(count, width, _weight=torch.empty(count, width))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMS norm over the last dim as in the official model (float32 statistics); no weight: normalise only."""
    if x.dtype == torch.float32:
        # 4 ops; F.rms_norm and x.pow(2).mean() + eps dispatch ~20 (Python scalars become tensors), and decode
        # steps are dispatch-bound. mean(x^2) + eps == |x|^2 / D + eps
        n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        out = x * torch.addcmul(_scalar(eps, x.get_device()), n, n, value=1.0 / x.shape[-1]).rsqrt_()
        return out if weight is None else out.mul_(weight)
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return x32.to(dtype) if weight is None else weight * x32.to(dtype)


_SCALARS: dict[tuple[float, int], Tensor] = {}


def _scalar(value: float, device: int) -> Tensor:
    """A cached 0-d float32 tensor; device as `Tensor.get_device()` gives it (-1: CPU), cheaper than `.device`."""
    t = _SCALARS.get((value, device))
    if t is None:
        t = _SCALARS[(value, device)] = torch.tensor(value, device="cpu" if device < 0 else device)
    return t


class Rotary(nn.Module):
    """Plain RoPE. Qwen3-TTS's interleaved multimodal RoPE reduces to this for text-only positions
    (all three position rows are equal). cos/sin come from a float32 table indexed by position."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self._table: tuple[Tensor, Tensor] | None = None

    def _tables(self, n: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        cached = self._table
        if cached is None or cached[0].shape[0] < n or cached[0].device != device or cached[0].dtype != dtype:
            size = max(n, 4096 if cached is None else 2 * cached[0].shape[0])
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
            freqs = torch.arange(size, device=device).float()[:, None] / (self.theta**exponents)
            emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
            self._table = cached = (emb.cos().to(dtype), emb.sin().to(dtype))
        return cached

    def forward(self, positions: Tensor, dtype: torch.dtype, max_position: int) -> tuple[Tensor, Tensor]:
        # positions: [B, T] -> cos, sin: [B, 1, T, D]
        cos, sin = self._tables(max_position + 1, positions.device, dtype)
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, arch: DecoderArch) -> None:
        super().__init__()
        h, d = arch.hidden_size, arch.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, d
        self.q_proj = nn.Linear(h, arch.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, arch.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, arch.num_kv_heads * d, bias=False)
        self.o_proj: nn.Module = nn.Linear(arch.num_heads * d, h, bias=False)  # or Int8Linear / PackedLinear
        self.q_norm = RMSNorm(d, arch.rms_norm_eps)
        self.k_norm = RMSNorm(d, arch.rms_norm_eps)
        self.qkv: Projection | None = None  # H -> (Hq + 2 Hkv) D, built by fuse()
        self.qkv_weight: Tensor | None = None  # [(Hq + 2 Hkv) D, H], the one q/k/v weight fuse() builds
        self.qk_norm: Tensor | None = None  # [Hq + Hkv, D]

    def fuse(self) -> tuple[Projection, Tensor]:
        """One matmul for q/k/v and one norm weight for q and k (fewer ops per step: decode is dispatch-bound).
        The projections keep views of the fused weight, so the state dict is unchanged and nothing is copied."""
        if self.qkv is None or self.qk_norm is None:
            d = self.head_dim
            self.qkv_weight = share_weights(self.q_proj, self.k_proj, self.v_proj)
            self.qkv = dense(self.qkv_weight)
            self.qk_norm = torch.cat((self.q_norm.weight.expand(self.num_heads, d),
                                      self.k_norm.weight.expand(self.num_kv_heads, d)))
        return self.qkv, self.qk_norm

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVStore, layer: int) -> Tensor:
        # x: [B, T, H]
        qkv_proj, qk_norm = self.fuse()
        b, t, _ = x.shape
        hq, hkv = self.num_heads, self.num_kv_heads
        qkv = qkv_proj(x).view(b, t, hq + 2 * hkv, self.head_dim)
        qk = rms_norm(qkv[:, :, : hq + hkv], None, self.q_norm.eps) * qk_norm
        qk = apply_rope(qk.transpose(1, 2), cos, sin)  # [B, Hq + Hkv, T, D]
        out = kv.attend(layer, qk[:, :hq], qk[:, hq:], qkv[:, :, hq + hkv :].transpose(1, 2))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj: nn.Module = nn.Linear(intermediate, hidden, bias=False)  # or Int8Linear / PackedLinear
        self.gate_up: Projection | None = None  # H -> 2 I, built by fuse()
        self.gate_up_weight: Tensor | None = None  # [2 I, H]

    def fuse(self) -> Projection:
        if self.gate_up is None:
            self.gate_up_weight = share_weights(self.gate_proj, self.up_proj)
            self.gate_up = dense(self.gate_up_weight)
        return self.gate_up

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fuse()(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def share_weights(*linears: nn.Linear) -> Tensor:
    """One weight for bias-free linears of the same input; each keeps a view of its rows of it."""
    fused = torch.cat([lin.weight for lin in linears])
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[row : row + n], requires_grad=False)
        row += n
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, arch: DecoderArch) -> None:
        super().__init__()
        self.self_attn = Attention(arch)
        self.mlp = MLP(arch.hidden_size, arch.intermediate_size)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVStore, layer: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """`layers` + final `norm` + `rotary`, the shape shared by the Talker backbone and the code predictor."""

    def __init__(self, arch: DecoderArch) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(arch) for _ in range(arch.num_layers)])
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.rotary = Rotary(arch.head_dim, arch.rope_theta)

    def run(self, x: Tensor, positions: Tensor, kv: KVStore, max_position: int) -> Tensor:
        # x: [B, T, H], positions: [B, T] (host-known upper bound max_position) -> [B, T, H]
        cos, sin = self.rotary(positions, x.dtype, max_position)
        return self.run_rope(x, cos, sin, kv)

    def run_rope(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVStore) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv, i)
        return self.norm(x)


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    # q: [B, Hq, T, D], k/v: [B, Hkv, S, D]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)

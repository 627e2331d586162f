"""The code predictor's per-frame decode, specialised for what sets it apart from the Talker's: every row of the
batch sits at the same positions (0..G), so RoPE is one fixed linear map per position and the KV cache is a dense
slice shared by the batch.

Same math as `DecoderStack.run_rope` with the layers' own weights, in about a third of the ops. This loop runs
G - 1 times per Talker step, so on CPU (and on a GPU without graphs) its cost is op dispatch, not flops:
- q/k/v and gate/up projections are one matmul each (the modules' weights become views of the fused ones);
- the q/k norm weights, RoPE at each position and the attention scale are folded into one [D, D] matrix per
  position and head kind, applied with one matmul;
- attention is two batched matmuls over the dense cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from talker.models.qwen3_tts.layers import Attention, DecoderLayer, DecoderStack, rms_norm
from talker.models.qwen3_tts.linear import Projection, projection
from talker.models.qwen3_tts.model import CodePredictor


@dataclass(slots=True)
class FusedLayer:
    ln1: Tensor  # [H]
    qkv: Projection  # H -> (Hq + 2 Hkv) D
    o: Projection  # Hq D -> H
    ln2: Tensor  # [H]
    gate_up: Projection  # H -> 2 I
    down: Projection  # I -> H
    rope_q: Tensor  # [P, D, D]: q_norm weight, RoPE at p, 1/sqrt(D)
    rope_k: Tensor  # [P, D, D]: k_norm weight, RoPE at p


class FusedPredictor:
    """The code predictor's decoder stack for rows that share positions, with its own dense KV cache."""

    def __init__(self, cp: CodePredictor, max_batch: int, positions: int) -> None:
        stack = cp.model
        arch_layer = stack.layers[0].self_attn
        assert isinstance(arch_layer, Attention)
        self.hq, self.hkv, self.d = arch_layer.num_heads, arch_layer.num_kv_heads, arch_layer.head_dim
        self.eps = stack.norm.eps
        project = cp.small_to_mtp_projection
        self.project = None if isinstance(project, nn.Identity) else projection(project)
        self.norm = stack.norm.weight
        self.heads = [projection(head) for head in cp.lm_head]  # H_pred -> V each
        self.embeddings: list[Tensor] = [emb.weight for emb in stack.codec_embedding]  # type: ignore[misc]  # [V, H]
        ref = stack.norm.weight
        rot = _rope_maps(stack, positions, ref.device)  # [P, D, D] float32
        self.layers = [_fuse(layer, rot, self.d) for layer in stack.layers if isinstance(layer, DecoderLayer)]
        shape = (len(self.layers), max_batch, self.hkv, positions, self.d)
        self.k = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
        self.v = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
        self._masks: dict[tuple[int, int], Tensor] = {}

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def step(self, x: Tensor, start: int) -> Tensor:
        """x: [B, T, H_talker] at positions start..start+T-1 of every row -> last hidden [B, H_pred]."""
        b, t, _ = x.shape  # kept [B, T, H]: packed projections tell one request's rows from a batch by B
        if self.project is not None:
            x = self.project(x)
        for i, layer in enumerate(self.layers):
            x = x + self._attend(i, layer, rms_norm(x, layer.ln1, self.eps), b, t, start)
            gate, up = layer.gate_up(rms_norm(x, layer.ln2, self.eps)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate).mul_(up))
        return rms_norm(x[:, -1], self.norm, self.eps)

    def _attend(self, i: int, layer: FusedLayer, x: Tensor, b: int, t: int, start: int) -> Tensor:
        # x: [B, T, H] -> [B, T, H]
        hq, hkv, d = self.hq, self.hkv, self.d
        g, end = hq // hkv, start + t
        # 1. q/k/v; q/k normalised (their norm weights live in the rope maps)
        qk, v = layer.qkv(x).view(b, t, hq + 2 * hkv, d).split_with_sizes((hq + hkv, hkv), dim=2)
        qk = rms_norm(qk, None, self.eps)
        q = _rotate(qk[:, :, :hq], layer.rope_q, start)  # [B, T, Hq, D]
        k = _rotate(qk[:, :, hq:], layer.rope_k, start)  # [B, T, Hkv, D]
        # 2. store k/v at start..end of every row: cache [B, Hkv, P, D]
        cache_k, cache_v = self.k[i, :b], self.v[i, :b]
        cache_k[:, :, start:end] = k.transpose(1, 2)
        cache_v[:, :, start:end] = v.transpose(1, 2)
        keys = cache_k[:, :, :end].reshape(b * hkv, end, d)  # views: batch and head dims merge
        values = cache_v[:, :, :end].reshape(b * hkv, end, d)
        # 3. GQA attention, the q heads of one kv head side by side: q [B Hkv, G T, D]
        q = q.view(b * hkv, g, d) if t == 1 else q.view(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(-1, g * t, d)
        # On one thread: these matrices are tiny (end <= G + 1), and a parallel region waits for its slowest thread,
        # a whole scheduler slice whenever the codec process holds the other core (3 us alone, 69 us on average in
        # the engine at the 0.6B sizes; one thread here made a step 4 % faster there). Threads are per thread in
        # torch, so this is the worker's own setting, put back below.
        threads = torch.get_num_threads() if x.device.type == "cpu" else 1
        if threads > 1:
            torch.set_num_threads(1)
        try:
            scores = torch.bmm(q, keys.transpose(1, 2))  # [B Hkv, G T, end]
            if t > 1:
                scores = scores + self._mask(start, t, g, scores.device, scores.dtype)
            probs = scores.softmax(dim=-1) if scores.dtype == torch.float32 else scores.float().softmax(-1).to(x.dtype)
            out = torch.bmm(probs, values)  # [B Hkv, G T, D]
        finally:
            if threads > 1:
                torch.set_num_threads(threads)
        if t > 1:
            out = out.view(b, hkv, g, t, d).permute(0, 3, 1, 2, 4)
        return layer.o(out.reshape(b, t, hq * d))

    def _mask(self, start: int, t: int, g: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        mask = self._masks.get((start, t))
        if mask is None:
            query_pos = torch.arange(start, start + t, device=device).repeat(g)  # rows ordered (head, t)
            allowed = torch.arange(start + t, device=device)[None, :] <= query_pos[:, None]
            mask = self._masks[(start, t)] = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
                ~allowed, float("-inf")
            )
        return mask  # [G T, end]


def _rotate(x: Tensor, maps: Tensor, start: int) -> Tensor:
    # x: [B, T, h, D] at positions start..start+T-1, maps: [P, D, D]
    t = x.shape[1]
    if t == 1:
        return x @ maps[start]
    # one [B h, D] x [D, D] product per position (a broadcast matmul would expand maps to [B, T, h, D, D])
    b, _, h, d = x.shape
    return (x.transpose(0, 1).reshape(t, b * h, d) @ maps[start : start + t]).view(t, b, h, d).transpose(0, 1)


def _rope_maps(stack: DecoderStack, positions: int, device: torch.device) -> Tensor:
    """RoPE at each position as a matrix: rope(x) = x @ R[p]. -> [P, D, D] float32"""
    d = stack.rotary.head_dim
    cos, sin = stack.rotary(torch.arange(positions, device=device)[None], torch.float32, positions - 1)
    cos, sin = cos[0, 0], sin[0, 0]  # [P, D]
    half = d // 2
    turn = torch.zeros(d, d, device=device)  # rotate_half(x) = x @ turn
    turn[torch.arange(half, d), torch.arange(half)] = -1.0
    turn[torch.arange(half), torch.arange(half, d)] = 1.0
    return torch.diag_embed(cos) + turn[None] * sin[:, None, :]


def _fuse(layer: DecoderLayer, rot: Tensor, head_dim: int) -> FusedLayer:
    attn, mlp = layer.self_attn, layer.mlp
    qkv, _ = attn.fuse()
    dtype = attn.q_norm.weight.dtype
    rope_q = (attn.q_norm.weight.float()[:, None] * rot / math.sqrt(head_dim)).to(dtype)
    rope_k = (attn.k_norm.weight.float()[:, None] * rot).to(dtype)
    return FusedLayer(layer.input_layernorm.weight, qkv, projection(attn.o_proj), layer.post_attention_layernorm.weight,
                      mlp.fuse(), projection(mlp.down_proj), rope_q, rope_k)

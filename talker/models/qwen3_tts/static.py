"""The Qwen3-TTS step with static shapes, written for `torch.compile` (talker/compiled.py) and CUDA graphs.

Rows are slots: a step runs over slots [0, B) for a batch bucket B, the rows that are not in it computed and thrown
away (`active`). So the programs see the same shapes at every step of a bucket, read the slot caches as views
(no gather), and a row's arithmetic does not depend on its bucket or on its neighbours:
- every projection's result for a row is the one the row gets alone (talker/models/qwen3_tts/static_linear.py);
- the Talker's attention reads each row's own positions (`static_ops.slot_attention`) on the CPU, and the whole
  slot under a mask on CUDA (a graph cannot depend on host-known lengths);
- norms, RoPE, the code predictor's attention over its 17 positions and the draws are the compiler's own loops,
  a row at a time.

Three programs, each kept small (the compiler's time grows with a program's size): `decode` (the Talker's forward for
one frame per row), `first` (codebook 0's draw, then the code predictor's first sub-step over positions 0 and 1 and
codebook 1's draw) and `next` (one further sub-step with its draw, the sub-step a tensor: the same program runs 14
times a step); outside the compiler, `prefill` (new prompts, per-row attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from talker import static_ops
from talker.models.qwen3_tts.config import Qwen3TTSConfig
from talker.models.qwen3_tts.layers import DecoderLayer, DecoderStack
from talker.models.qwen3_tts.model import Talker
from talker.models.qwen3_tts.static_linear import Linear, linear_loops, static_linear

MIN_FRAMES_BEFORE_EOS = 2
CANDIDATES = 64  # a draw's candidates when every row's top_k fits (the checkpoints' default is 50); else all


@dataclass(slots=True)
class Layer:
    ln1: Tensor  # [H]
    qkv: Linear  # H -> (Hq + 2 Hkv) D
    qk_norm: Tensor  # [Hq + Hkv, D]
    o: Linear
    ln2: Tensor
    gate_up: Linear  # H -> 2 I
    down: Linear


class Stack:
    """A decoder stack's weights for the static programs (the Talker's or the code predictor's)."""

    def __init__(self, stack: DecoderStack, positions: int) -> None:
        first = stack.layers[0]
        assert isinstance(first, DecoderLayer)
        attn = first.self_attn
        self.hq, self.hkv, self.d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.eps = stack.norm.eps
        self.norm = stack.norm.weight.detach()
        self.layers = [_layer(layer) for layer in stack.layers if isinstance(layer, DecoderLayer)]
        ref = stack.norm.weight
        self.cos, self.sin = stack.rotary._tables(positions, ref.device, ref.dtype)  # [P, D] each

    def qkv(self, layer: Layer, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: [..., H], cos/sin: [..., 1, D] -> q [..., Hq, D], k and v [..., Hkv, D] (q, k normed and rotated)."""
        hq, hkv = self.hq, self.hkv
        qkv = layer.qkv(rms_norm(x, layer.ln1, self.eps)).unflatten(-1, (hq + 2 * hkv, self.d))
        qk = rms_norm(qkv[..., : hq + hkv, :], layer.qk_norm, self.eps)
        qk = qk * cos + _rotate_half(qk) * sin
        return qk[..., :hq, :], qk[..., hq:, :], qkv[..., hq + hkv :, :]

    def mlp(self, layer: Layer, x: Tensor) -> Tensor:
        gate, up = layer.gate_up(rms_norm(x, layer.ln2, self.eps)).chunk(2, dim=-1)
        return x + layer.down(F.silu(gate) * up)


def _layer(layer: DecoderLayer) -> Layer:
    attn, mlp = layer.self_attn, layer.mlp
    qkv, qk_norm = attn.fuse()
    return Layer(layer.input_layernorm.weight.detach(), static_linear(qkv), qk_norm.detach(),
                 static_linear(attn.o_proj), layer.post_attention_layernorm.weight.detach(),
                 static_linear(mlp.fuse()), static_linear(mlp.down_proj))


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@dataclass(slots=True)
class Draw:
    """One draw's sampling parameters per row of a bucket."""

    temperature: Tensor  # [B] float32 (> 0)
    top_k: Tensor  # [B] int64 (the vocabulary's size when off)
    top_p: Tensor  # [B] float32
    greedy: Tensor  # [B] bool


def draw(logits: Tensor, p: Draw, u: Tensor, candidates: int) -> Tensor:
    """logits: [B, V] float32, u: [B] -> tokens [B] int64: inverse CDF over the top candidates, as talker/sampler.py
    defines it (top-k, temperature, top-p, one uniform per row)."""
    values, ids = torch.ops.talkstream.top_candidates(logits, candidates)  # [B, K], descending
    scaled = values / p.temperature[:, None]
    rank = torch.arange(candidates, device=logits.device)
    scaled = scaled.masked_fill(rank[None, :] >= p.top_k[:, None], float("-inf"))
    probs = scaled.softmax(dim=-1)
    probs = probs.masked_fill(probs.cumsum(dim=-1) - probs >= p.top_p[:, None], 0.0)  # the first always stays
    cdf = probs.cumsum(dim=-1)
    pick = (cdf < u[:, None] * cdf[:, -1:]).sum(dim=-1, keepdim=True).clamp(max=candidates - 1)
    return torch.where(p.greedy, ids[:, 0], ids.gather(1, pick)[:, 0])


class StaticTalker:
    """The static programs of one loaded Talker. `cuda_attention`: the decode's attention in the graph over the
    whole slot (a CUDA graph cannot read host-known lengths); else per row through `slot_attention`."""

    def __init__(self, talker: Talker, cfg: Qwen3TTSConfig, max_len: int) -> None:
        self.cfg = cfg
        self.groups = cfg.num_code_groups
        self.stack = Stack(talker.model, max_len)
        cp = talker.code_predictor
        self.predictor = Stack(cp.model, self.groups + 1)
        self.project = None if isinstance(cp.small_to_mtp_projection, nn.Identity) else static_linear(
            cp.small_to_mtp_projection)
        self.codec_head = static_linear(talker.codec_head)
        self.text_embedding = talker.model.text_embedding.weight.detach()
        text = talker.text_projection
        self.text_fc1, self.text_fc2 = static_linear(text.linear_fc1), static_linear(text.linear_fc2)
        self.heads = [static_linear(head) for head in cp.lm_head]
        self.codec_embedding = talker.model.codec_embedding.weight.detach()  # [V, H]
        self.embeddings = [emb.weight.detach() for emb in cp.model.codec_embedding
                           if isinstance(emb, nn.Embedding)]  # [V, H] each
        self.embedding_table = torch.stack(self.embeddings)  # [G - 1, V, H]: sub-step g reads rows of table g - 1
        # codebook g's head, g a tensor: a registered call that picks it (CPU), or a stacked weight (CUDA)
        heads = self.heads
        self.heads_key = -1 if heads[0].key < 0 else static_ops.register_indexed(
            list(heads), first=1)
        self.head_weights = None if heads[0].weight is None else torch.stack(
            [head.weight for head in heads if head.weight is not None])  # [G - 1, V, Hp]
        vocab = cfg.talker.vocab_size
        self.suppress = torch.zeros(vocab, dtype=torch.float32, device=self.codec_embedding.device)
        self.suppress[vocab - 1024 :] = float("-inf")
        self.suppress[cfg.codec.eos] = 0.0
        self.cuda_attention = self.codec_embedding.device.type == "cuda"

    def embed_text(self, ids: Tensor) -> Tensor:
        """Talker.embed_text with a row's result independent of the others: ids [...] -> [..., H]."""
        return self.text_fc2(F.silu(self.text_fc1(F.embedding(ids, self.text_embedding))))

    # 1. the Talker's forward, one frame per row -------------------------------------------------------------------
    def decode(self, x: Tensor, positions: Tensor, active: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """x: [B, H] (slots 0..B-1), positions: [B], active: [B] bool; k, v: the slot cache [L, S, Hkv, T, D]
        -> hidden [B, H]. An idle row writes its keys at its own next position, which is written again before
        anything reads it, and attends to nothing."""
        s, b = self.stack, x.shape[0]
        rows = torch.arange(b, device=x.device)[:, None]  # [B, 1]
        heads = torch.arange(s.hkv, device=x.device)[None, :]  # [1, Hkv]
        at = positions.clamp(max=k.shape[3] - 1)[:, None]  # [B, 1]
        cos, sin = s.cos[positions][:, None], s.sin[positions][:, None]  # [B, 1, D]
        n = torch.where(active, positions + 1, 0)  # positions each row attends to
        for i, layer in enumerate(s.layers):
            q, key, value = s.qkv(layer, x, cos, sin)  # [B, h, D]
            if self.cuda_attention:
                cache_k, cache_v = k[i, :b], v[i, :b]  # [B, Hkv, T, D], views
                cache_k.index_put_((rows, heads, at), key)
                cache_v.index_put_((rows, heads, at), value)
                out = self._masked_attention(q, cache_k, cache_v, n)
            else:  # the write in the call too: the compiler would copy the cache to hand a written one to a call
                out = torch.ops.talkstream.slot_attention(q, key, value, k, v, i, at[:, 0], n)
            x = x + layer.o(out.flatten(1))
            x = s.mlp(layer, x)
        return rms_norm(x, s.norm, s.eps)

    def _masked_attention(self, q: Tensor, k: Tensor, v: Tensor, n: Tensor) -> Tensor:
        # q: [B, Hq, D], k/v: [B, Hkv, T, D]; an idle row sees position 0 (no row may see nothing)
        mask = torch.arange(k.shape[2], device=q.device)[None, :] < n.clamp(min=1)[:, None]  # [B, T]
        out = F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask[:, None, None, :], enable_gqa=True)
        return out[:, :, 0]

    # 2. codebook 0's draw and the code predictor's first sub-step, then its other sub-steps one program each -----
    def sample_first(self, hidden: Tensor, frames: Tensor, seen: Tensor, penalty: Tensor, seeds: Tensor,
                     talker: Draw, predictor: Draw, k: Tensor, v: Tensor, candidates: tuple[int, int]
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """hidden: [B, H], frames/seeds: [B], seen: [B, V] bool, penalty: [B]; k, v: the code predictor's cache
        [Lp, S, Hkv, G + 1, D] -> codes 0 and 1 [B, 2], the frame's uniforms [B, G], codebook 1's embedding and the
        sum so far [B, H] each."""
        eos = self.cfg.codec.eos
        logits = self.codec_head(hidden).float() + self.suppress  # [B, V]
        early = (frames < MIN_FRAMES_BEFORE_EOS)[:, None] & (torch.arange(logits.shape[1], device=logits.device)
                                                            == eos)[None, :]
        logits = logits.masked_fill(early, float("-inf"))
        penalised = torch.where(logits > 0, logits / penalty[:, None], logits * penalty[:, None])
        logits = torch.where(seen, penalised, logits)
        u = torch.ops.talkstream.uniforms(seeds, frames, self.groups)  # [B, G]
        code0 = draw(logits, talker, u[:, 0], candidates[0])
        emb0 = F.embedding(code0, self.codec_embedding)
        positions = torch.arange(2, device=hidden.device)
        h = self._predict(torch.stack((hidden, emb0), dim=1), positions, k, v)  # [B, Hp]: one read of the weights
        code1 = draw(self.heads[0](h).float(), predictor, u[:, 1], candidates[1])
        emb1 = F.embedding(code1, self.embeddings[0])
        return torch.stack((code0, code1), dim=1), u, emb1, emb0 + emb1

    def sample_next(self, g: Tensor, emb: Tensor, emb_sum: Tensor, u: Tensor, predictor: Draw, k: Tensor,
                    v: Tensor, candidates: int) -> tuple[Tensor, Tensor, Tensor]:
        """Sub-step g (a 0-d tensor: one program serves sub-steps 2 .. G - 1), from code g - 1's embedding [B, H]
        -> code g [B], its embedding and the frame's sum so far [B, H]."""
        h = self._predict(emb[:, None], g[None], k, v)
        logits = self.heads_at(g, h).float()
        code = draw(logits, predictor, u.gather(1, g.expand(u.shape[0], 1))[:, 0], candidates)
        emb = self.embedding_at(g, code)
        return code, emb, emb_sum + emb

    def heads_at(self, g: Tensor, h: Tensor) -> Tensor:
        """Codebook g's head on h: [B, Hp] -> [B, V]."""
        if self.heads_key >= 0:
            return torch.ops.talkstream.project_at(h, self.heads_key, g, self.cfg.predictor.vocab_size)
        assert self.head_weights is not None
        if self.heads[0].loops:
            return linear_loops(h, self.head_weights.index_select(0, (g - 1)[None])[0], None)
        return F.linear(h, self.head_weights.index_select(0, (g - 1)[None])[0])  # [V, Hp] picked on the device

    def embedding_at(self, g: Tensor, code: Tensor) -> Tensor:
        return self.embedding_table[(g - 1).expand_as(code), code]  # [B, H]

    def _predict(self, x: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """x: [B, T, H] at `positions` [T] of every row -> the last one's hidden [B, Hp]. Attention runs over all
        G + 1 cache positions under a mask, so every sub-step has the same shapes (and the same kernels)."""
        s, b = self.predictor, x.shape[0]
        if self.project is not None:
            x = self.project(x)
        cos, sin = s.cos[positions][None, :, None], s.sin[positions][None, :, None]  # [1, T, 1, D]
        seen = torch.arange(k.shape[3], device=x.device)[None, :] <= positions[:, None]  # [T, P]
        for i, layer in enumerate(s.layers):
            q, key, value = s.qkv(layer, x, cos, sin)  # [B, T, h, D]
            cache_k, cache_v = k[i, :b], v[i, :b]  # [B, Hkv, P, D]
            cache_k.index_copy_(2, positions, key.transpose(1, 2))
            cache_v.index_copy_(2, positions, value.transpose(1, 2))
            x = x + layer.o(_small_attention(q, cache_k, cache_v, seen).flatten(2))
            x = s.mlp(layer, x)
        return rms_norm(x[:, -1], s.norm, s.eps)


def _small_attention(q: Tensor, k: Tensor, v: Tensor, causal: Tensor) -> Tensor:
    """The code predictor's attention as loops the compiler writes (a few positions; a batched matmul library call
    would round differently with the batch). q: [B, T, Hq, D], k/v: [B, Hkv, E, D], causal: [T, E] -> [B, T, Hq, D]"""
    b, t, hq, d = q.shape
    hkv = k.shape[1]
    q = q.view(b, t, hkv, hq // hkv, 1, d)
    scores = (q * k[:, None, :, None]).sum(-1) * (1.0 / math.sqrt(d))  # [B, T, Hkv, g, E]
    scores = scores.float().masked_fill(~causal[None, :, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1).to(v.dtype)
    out = (probs[..., None] * v[:, None, :, None]).sum(-2)  # [B, T, Hkv, g, D]
    return out.reshape(b, t, hq, d)


def prefill(static: StaticTalker, x: Tensor, lengths: list[int], slots: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """New prompts in one forward, outside the compiler (their lengths vary). x: [n, T, H] right-padded, slots: [n];
    each row attends to its own positions only -> last hidden [n, H]."""
    s, (n, t, _) = static.stack, x.shape
    cos, sin = s.cos[:t][None, :, None], s.sin[:t][None, :, None]  # [1, T, 1, D]
    for i, layer in enumerate(s.layers):
        q, key, value = s.qkv(layer, x, cos, sin)  # [n, T, h, D]
        key, value = key.transpose(1, 2), value.transpose(1, 2)  # [n, Hkv, T, D]
        k[i, slots, :, :t] = key
        v[i, slots, :, :t] = value
        out = torch.zeros_like(q)
        for row, length in enumerate(lengths):
            out[row, :length] = F.scaled_dot_product_attention(
                q[row : row + 1, :length].transpose(1, 2), key[row : row + 1, :, :length],
                value[row : row + 1, :, :length], is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        x = s.mlp(layer, x + layer.o(out.flatten(2)))
    last = x[torch.arange(n, device=x.device), torch.tensor(lengths, device=x.device) - 1]
    return rms_norm(last, s.norm, s.eps)

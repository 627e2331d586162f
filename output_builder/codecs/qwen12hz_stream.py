"""Exact stateful streaming decode for the Qwen3-TTS 12 Hz codec: each chunk decodes only its new frames.

Every layer of the decoder is causal, so one request's past is summarised by a small per-layer state:

* causal conv (kernel k, dilation d): last ``(k - 1) * d`` input samples, prepended instead of zero padding;
* transposed conv (kernel k, stride s): the last ``ceil(k / s) - 1`` input samples, whose outputs overlap
  the next chunk's first ``k - s`` samples (none when k == s); the one-shot path drops the same tail;
* sliding-window attention (window W counts the query frame itself): the last W - 1 rotated keys and values
  per layer, with absolute RoPE positions so the tables are the one-shot ones;
* everything else (codebooks, 1x1 convs, SnakeBeta, norms, MLPs) is per-sample and needs no state.

A fresh state is all zeros, which is exactly the one-shot zero padding, so chunked output equals ``decode()``.
Streams at different positions batch together: positions and the key mask are per batch row.

Hot path (one CPU thread): a transposed conv runs as a polyphase conv1d (kernel ``ceil(k / s)``, ``C_out * s``
outputs); SnakeBeta writes straight into the next conv's padded input buffer instead of a ``cat``; the
residual 1x1 convs also add the skip connection. ``CodecOps`` runs the convs and SnakeBeta as fused native
kernels when they are loaded, else in torch (small convs as im2col GEMMs).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from output_builder.codecs.qwen12hz_layers import (
    Attention,
    CausalConv1d,
    CausalTransConv1d,
    ConvNeXtBlock,
    DecoderBlock,
    ResidualUnit,
    SlidingTransformer,
    SnakeBeta,
    TransformerLayer,
)
from output_builder.codecs.qwen12hz_ops import CodecOps, Derived, snake_scales, trans_as_conv

if TYPE_CHECKING:
    from output_builder.codecs.qwen12hz_decoder import Qwen12HzDecoder

StreamJob = tuple["DecodeStream", Tensor]


@dataclass(eq=False, slots=True)
class DecodeStream:
    """One request's decoder state. Opaque to callers; create with ``Qwen12HzCodec.open_stream()``."""

    state: Tensor  # [S]: every stateful layer's slot, flattened and packed in StreamingDecoder order
    owner: int  # id() of the StreamingDecoder that opened it
    frames_decoded: int = 0

    def nbytes(self) -> int:
        """Bytes of tensor state held; constant for the life of the stream."""
        return self.state.numel() * self.state.element_size()

    def copy(self) -> DecodeStream:
        """A stream that goes on from here on its own."""
        return DecodeStream(self.state.clone(), self.owner, self.frames_decoded)


def _trans_keep(layer: CausalTransConv1d) -> int:
    """Earlier input samples that still add into the outputs of the next input sample."""
    kernel, stride = layer.conv.kernel_size[0], layer.conv.stride[0]
    return math.ceil(kernel / stride) - 1


def _state_shape(module: nn.Module, window: int) -> tuple[int, ...] | None:
    """Per-stream state shape (without the batch dim) of a stateful layer, None for stateless ones."""
    if isinstance(module, CausalConv1d) and module.left_pad > 0:
        return (module.conv.in_channels, module.left_pad)
    if isinstance(module, CausalTransConv1d) and _trans_keep(module) > 0:
        return (module.conv.in_channels, _trans_keep(module))
    if isinstance(module, Attention):
        return (2, module.kv_heads, window - 1, module.head_dim)
    return None


class _Pass:
    """One batched step's view of the states: reads ``old`` slots, records the ``new`` ones (as views)."""

    def __init__(self, index: dict[nn.Module, int], old: list[Tensor], derived: Derived, ops: CodecOps) -> None:
        self.index, self.old, self.new, self.derived, self.ops = index, old, list(old), derived, ops

    def conv(self, layer: CausalConv1d, x: Tensor) -> Tensor:
        # x: [B, C_in, N] -> [B, C_out, N]
        slot = self.index.get(layer)
        if slot is None:
            return self.ops.run(layer.conv, x)
        full = torch.cat((self.old[slot], x), dim=-1)  # full: [B, C_in, pad + N]
        self.new[slot] = full[..., x.shape[-1] :]
        return self.ops.run(layer.conv, full)

    def snake(self, act: SnakeBeta, x: Tensor, out: Tensor | None = None) -> Tensor:
        """``SnakeBeta`` with the same arithmetic, in one temporary, optionally written into ``out``."""
        # x: [B, C, T]
        alpha, inv_beta = self.derived.get(act, lambda: snake_scales(act))
        return self.ops.snake(x, alpha, inv_beta, out)

    def snake_padded(self, act: SnakeBeta, layer: nn.Module, x: Tensor) -> Tensor:
        """snake(x) written right after ``layer``'s cached input samples: [B, C, keep + N], no cat."""
        slot, n = self.index[layer], x.shape[-1]
        old = self.old[slot]  # old: [B, C, keep]
        full = x.new_empty(x.shape[0], x.shape[1], old.shape[-1] + n)
        full[..., : old.shape[-1]] = old
        self.snake(act, x, out=full[..., old.shape[-1] :])
        self.new[slot] = full[..., n:]
        return full

    def trans(self, layer: CausalTransConv1d, full: Tensor, n: int) -> Tensor:
        """Transposed conv of the last N inputs of ``full`` [B, C_in, keep + N] -> [B, C_out, N * s]."""
        taps = full.shape[-1] - n + 1
        weight, bias = self.derived.get(layer, lambda: trans_as_conv(layer, taps))
        y = self.ops.conv(full, weight, bias)  # y: [B, C_out * s, N], channel o * s + j
        return y.unflatten(1, (-1, layer.stride)).transpose(2, 3).reshape(y.shape[0], -1, n * layer.stride)

    def kv(self, attn: Attention, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # k, v: [B, KVH, N, D] -> cached + new: [B, KVH, W - 1 + N, D]
        slot = self.index[attn]
        cache = self.old[slot]  # cache: [B, 2, KVH, W - 1, D]
        keep = cache.shape[3]
        k, v = torch.cat((cache[:, 0], k), dim=2), torch.cat((cache[:, 1], v), dim=2)
        length = k.shape[2]
        self.new[slot] = torch.stack((k[:, :, length - keep :], v[:, :, length - keep :]), dim=1)
        return k, v


def window_mask(start: Tensor, n: int, window: int) -> Tensor:
    """[B, 1, N, W - 1 + N] bool: key j (position start - W + 1 + j) is visible to query i (start + i)."""
    keep = window - 1
    i = torch.arange(n, device=start.device)[:, None]
    j = torch.arange(keep + n, device=start.device)[None, :]
    band = (j >= i) & (j <= i + keep)  # band: [N, L], ``t - W < s <= t``
    filled = j[None] >= (keep - start)[:, None, None]  # filled: [B, 1, L], position >= 0
    return (band[None] & filled)[:, None]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [B, H, N, D]; cos, sin: [B, 1, N, D]
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class StreamingDecoder:
    """Runs a :class:`Qwen12HzDecoder` chunk by chunk over stacked per-stream states."""

    def __init__(self, module: Qwen12HzDecoder) -> None:
        self.module = module
        self.window = module.cfg.sliding_window
        self.index: dict[nn.Module, int] = {}
        self.layout: list[tuple[int, int, tuple[int, ...]]] = []  # (offset, size, shape) per slot
        self.state_size = 0
        for sub in module.modules():
            shape = _state_shape(sub, self.window)
            if shape is not None:
                self.index[sub] = len(self.layout)
                self.layout.append((self.state_size, math.prod(shape), shape))
                self.state_size += math.prod(shape)
        self._freq: Tensor | None = None
        self.derived = Derived()
        self.ops = CodecOps()  # ops.native: fused CPU kernels, None for the torch path
        self.between: Callable[[], None] | None = None  # called between stages; may decode other streams

    def open(self) -> DecodeStream:
        param = next(self.module.parameters())
        return DecodeStream(param.new_zeros(self.state_size), owner=id(self))

    def decode(self, jobs: Sequence[StreamJob]) -> list[Tensor]:
        """Decodes every job's N new frames, one batch per distinct N; returns float32 CPU samples."""
        self._check(jobs)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, (_, codes) in enumerate(jobs):
            groups[int(codes.shape[-1])].append(i)
        out = [torch.zeros(0) for _ in jobs]
        for n, members in groups.items():
            if n == 0:
                continue
            wavs = self._decode_group([jobs[i] for i in members])
            for i, wav in zip(members, wavs, strict=True):
                out[i] = wav
            self._between()
        return out

    def _between(self) -> None:
        if self.between is not None:
            self.between()

    def _check(self, jobs: Sequence[StreamJob]) -> None:
        seen: set[int] = set()
        q = self.module.cfg.num_quantizers
        for state, codes in jobs:
            if state.owner != id(self):
                raise ValueError("DecodeStream was opened by a different codec")
            if id(state) in seen:
                raise ValueError("a DecodeStream appears in more than one job of one call")
            seen.add(id(state))
            if codes.dim() != 2 or codes.shape[0] != q:
                raise ValueError(f"stream codes must be [{q}, N], got {tuple(codes.shape)}")

    def _decode_group(self, jobs: list[StreamJob]) -> list[Tensor]:
        states = [state for state, _ in jobs]
        param = next(self.module.parameters())
        codes = torch.stack([c for _, c in jobs]).to(param.device, torch.long)  # codes: [B, Q, N]
        packed = torch.stack([s.state for s in states])  # packed: [B, S]
        start = torch.tensor([s.frames_decoded for s in states], device=param.device)
        wav, new = self.step(codes, self._unpack(packed), start)
        wav = wav.float().cpu()  # wav: [B, N * samples_per_frame]
        packed = torch.empty_like(packed)
        for view, slot in zip(self._unpack(packed), new, strict=True):
            view.copy_(slot)
        for b, state in enumerate(states):
            state.state = packed[b].clone() if len(states) > 1 else packed[0]
            state.frames_decoded += int(codes.shape[-1])
        return [row.clone() for row in wav] if len(states) > 1 else [wav[0]]

    def _unpack(self, packed: Tensor) -> list[Tensor]:
        # packed: [B, S] -> one view [B, *shape] per slot
        return [packed[:, off : off + size].view(-1, *shape) for off, size, shape in self.layout]

    def step(self, codes: Tensor, slots: list[Tensor], start: Tensor) -> tuple[Tensor, list[Tensor]]:
        """codes: [B, Q, N]; slots: stacked states; start: [B] frames already decoded.

        Returns the clamped waveform [B, N * samples_per_frame] and the new stacked states (views).
        """
        m, run = self.module, _Pass(self.index, slots, self.derived, self.ops)
        h = run.conv(m.pre_conv, m.quantizer.decode(codes))  # h: [B, latent, N]
        h = self._transformer(run, h.transpose(1, 2), start).transpose(1, 2)
        self._between()
        for stage in m.upsample:
            trans, block = cast(nn.Sequential, stage)
            h = run.trans(cast(CausalTransConv1d, trans), h, h.shape[-1])
            h = self._convnext(run, cast(ConvNeXtBlock, block), h)
        stages = list(m.decoder)
        h = run.conv(cast(CausalConv1d, stages[0]), h)  # h: [B, decoder_dim, N * 4]
        for block in stages[1:-2]:
            h = self._decoder_block(run, cast(DecoderBlock, block), h)
        final = cast(CausalConv1d, stages[-1])
        self._between()
        h = self.ops.run(final.conv, run.snake_padded(cast(SnakeBeta, stages[-2]), final, h))
        return h.squeeze(1).clamp(-1.0, 1.0), run.new

    def _convnext(self, run: _Pass, block: ConvNeXtBlock, x: Tensor) -> Tensor:
        # x: [B, C, T]
        h = run.conv(block.dwconv, x).transpose(1, 2)  # h: [B, T, C]
        h = block.pwconv2(block.act(block.pwconv1(block.norm(h))))
        return x + (block.gamma * h).transpose(1, 2)

    def _decoder_block(self, run: _Pass, block: DecoderBlock, x: Tensor) -> Tensor:
        # x: [B, C_in, T] -> [B, C_out, T * rate]
        act, trans, *units = block.block
        layer = cast(CausalTransConv1d, trans)
        x = run.trans(layer, run.snake_padded(cast(SnakeBeta, act), layer, x), x.shape[-1])
        for unit in units:
            self._between()
            x = self._residual_unit(run, cast(ResidualUnit, unit), x)
        return x

    def _residual_unit(self, run: _Pass, unit: ResidualUnit, x: Tensor) -> Tensor:
        # x: [B, C, T]
        h = run.snake(unit.act2, self.ops.run(unit.conv1.conv, run.snake_padded(unit.act1, unit.conv1, x)))
        return self.ops.run(unit.conv2.conv, h, residual=x)  # x + conv2(h)

    def _transformer(self, run: _Pass, x: Tensor, start: Tensor) -> Tensor:
        # x: [B, N, latent] -> [B, N, latent]; frame i of row b sits at position start[b] + i
        tr: SlidingTransformer = self.module.pre_transformer
        n = x.shape[1]
        pos = start[:, None] + torch.arange(n, device=x.device)  # pos: [B, N]
        angles = pos.float()[..., None] * self._inv_freq(x.device)  # angles: [B, N, D / 2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # angles: [B, 1, N, D]
        rope = (angles.cos().to(x.dtype), angles.sin().to(x.dtype))
        mask = window_mask(start, n, self.window)
        h = tr.input_proj(x)
        for layer in tr.layers:
            h = self._layer(run, cast(TransformerLayer, layer), h, rope, mask)
        return cast(Tensor, tr.output_proj(tr.norm(h)))

    def _layer(
        self, run: _Pass, layer: TransformerLayer, h: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor
    ) -> Tensor:
        # h: [B, N, hidden]
        h = h + layer.self_attn_layer_scale(
            self._attend(run, layer.self_attn, layer.input_layernorm(h), rope, mask)
        )
        return h + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(h)))

    def _attend(
        self, run: _Pass, attn: Attention, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor
    ) -> Tensor:
        # x: [B, N, hidden]; mask: [B, 1, N, W - 1 + N]
        cos, sin = rope

        def split(t: Tensor, heads: int) -> Tensor:  # [B, N, heads * D] -> [B, heads, N, D]
            return t.unflatten(-1, (heads, attn.head_dim)).transpose(1, 2)

        q = _rotate(split(attn.q_proj(x), attn.heads), cos, sin)
        k = _rotate(split(attn.k_proj(x), attn.kv_heads), cos, sin)
        k, v = run.kv(attn, k, split(attn.v_proj(x), attn.kv_heads))
        if attn.kv_heads != attn.heads:
            k = k.repeat_interleave(attn.heads // attn.kv_heads, dim=1)
            v = v.repeat_interleave(attn.heads // attn.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.head_dim**-0.5)
        return cast(Tensor, attn.o_proj(out.transpose(1, 2).flatten(2)))

    def _inv_freq(self, device: torch.device) -> Tensor:
        """RoPE inverse frequencies [D / 2]: the float32 values of ``rotary_tables`` (the one-shot path)."""
        if self._freq is None or self._freq.device != device:
            tr = self.module.pre_transformer
            exponent = torch.arange(0, tr.head_dim, 2, dtype=torch.int64, device=device).float() / tr.head_dim
            self._freq = 1.0 / (tr.theta**exponent)
        return self._freq

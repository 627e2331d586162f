"""`--quantize int8`: the Talker's and code predictor's linear layers as int8 weights (see `linear.Int8Linear`).

Quantized: every projection a decode step streams through (q/k/v, o, gate/up, down of all decoder layers, the codec
head, the 15 code-predictor heads, the predictor's input projection, the text projection). Kept in full precision:
embeddings (a step reads one row of each), norms, the codec. The full-precision weights are released, so the
Talker's resident size drops by about 4x along with the bytes each step reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from talker.models.qwen3_tts.layers import DecoderLayer
from talker.models.qwen3_tts.linear import Int8Linear, projection
from talker.models.qwen3_tts.model import Qwen3TTSModel

QUANTIZE_CHOICES = ("int8",)


@dataclass(frozen=True, slots=True)
class Quantized:
    layers: int  # linear layers made int8
    bytes_before: int
    bytes_after: int


def quantize_int8(model: Qwen3TTSModel) -> Quantized:
    talker = model.talker
    done: list[tuple[int, int]] = []  # (bytes before, after) per layer

    def int8(weight: Tensor, bias: Tensor | None = None) -> Int8Linear:
        q = Int8Linear(weight, bias)
        done.append((weight.numel() * weight.element_size(), q.nbytes))
        return q

    def replace(linear: nn.Module) -> Int8Linear:
        assert isinstance(linear, nn.Linear)
        return int8(linear.weight, linear.bias)

    for stack in (talker.model, talker.code_predictor.model):
        for layer in stack.layers:
            assert isinstance(layer, DecoderLayer)
            attn, mlp = layer.self_attn, layer.mlp
            attn.fuse()
            attn.qkv = projection(int8(_stacked(attn.q_proj, attn.k_proj, attn.v_proj)))
            attn.o_proj = replace(attn.o_proj)
            mlp.gate_up = projection(int8(_stacked(mlp.gate_proj, mlp.up_proj)))
            mlp.down_proj = replace(mlp.down_proj)
            _release(attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)
    talker.codec_head = replace(talker.codec_head)
    predictor = talker.code_predictor
    for i, head in enumerate(predictor.lm_head):
        predictor.lm_head[i] = replace(head)
    if isinstance(predictor.small_to_mtp_projection, nn.Linear):
        predictor.small_to_mtp_projection = replace(predictor.small_to_mtp_projection)
    text = talker.text_projection
    text.linear_fc1, text.linear_fc2 = replace(text.linear_fc1), replace(text.linear_fc2)
    return Quantized(len(done), sum(b for b, _ in done), sum(a for _, a in done))


def _stacked(*linears: nn.Linear) -> Tensor:
    return torch.cat([lin.weight for lin in linears])


def _release(*linears: nn.Linear) -> None:
    """Drop full-precision weights the int8 projections replaced (they are views of the fused weight)."""
    for lin in linears:
        lin.weight = nn.Parameter(lin.weight.new_empty(0), requires_grad=False)

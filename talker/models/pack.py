"""Batch packing on the CPU: the Talker's large float32 projections as `linear.PackedLinear`.

Applied by the loader to float32 checkpoints on the CPU (not with `--quantize int8`, which replaces these weights).
Packed: q/k/v (fused), o, gate/up (fused) and down of every Talker and code-predictor layer (a step reads them
28 + 15 x 5 times at the 0.6B sizes), the codec head and the 15 code-predictor heads. Weights under
`PACK_MIN_ELEMENTS` (the tiny model's) are left as they are. The full-precision weights stay (single requests and
small batches use them), so packing costs one more copy of these weights in memory.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from talker.models.qwen3_tts.layers import DecoderLayer
from talker.models.qwen3_tts.linear import PackedLinear, projection
from talker.models.qwen3_tts.model import Qwen3TTSModel


def pack_for_batches(model: Qwen3TTSModel) -> int:
    """Pack what pays; -> the packed copies' bytes (0: nothing was large enough)."""
    talker = model.talker
    packed: list[PackedLinear] = []

    def pack(weight: Tensor, bias: Tensor | None = None) -> PackedLinear | None:
        if not PackedLinear.applies(weight):
            return None
        packed.append(PackedLinear(weight, bias))
        return packed[-1]

    for stack in (talker.model, talker.code_predictor.model):
        for layer in stack.layers:
            assert isinstance(layer, DecoderLayer)
            attn, mlp = layer.self_attn, layer.mlp
            attn.fuse()
            mlp.fuse()
            assert attn.qkv_weight is not None and mlp.gate_up_weight is not None
            if (qkv := pack(attn.qkv_weight)) is not None:
                attn.qkv = projection(qkv)
            if (gate_up := pack(mlp.gate_up_weight)) is not None:
                mlp.gate_up = projection(gate_up)
            attn.o_proj, mlp.down_proj = _packed(attn.o_proj, pack), _packed(mlp.down_proj, pack)
    talker.codec_head = _packed(talker.codec_head, pack)
    heads = talker.code_predictor.lm_head
    for i, head in enumerate(heads):
        heads[i] = _packed(head, pack)
    return sum(p.nbytes for p in packed)


def _packed(linear: nn.Module, pack: Callable[[Tensor, Tensor | None], PackedLinear | None]) -> nn.Module:
    assert isinstance(linear, nn.Linear)
    module = pack(linear.weight.data, None if linear.bias is None else linear.bias.data)
    return linear if module is None else module

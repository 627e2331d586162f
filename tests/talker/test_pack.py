"""Batch packing (`talker/models/pack.py`) on the tiny checkpoint with the size floor lowered to 0, so every layer
and head the loader would pack at real sizes is packed here: what it packs, what it keeps, and that requests
still get the official package's greedy codes, alone (bit for bit the same arithmetic) and batched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from talker.models.loader import LoadedTalker, load_talker
from talker.models.qwen3_tts import linear
from talker.models.qwen3_tts.layers import DecoderLayer
from talker.models.qwen3_tts.linear import PackedLinear
from tests.talker.oracle_fixture import Oracle
from tests.talker.test_oracle_parity import GREEDY, assert_same_codes, run

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def packed(tiny_dir: Path) -> LoadedTalker:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(linear, "PACK_MIN_ELEMENTS", 0)
        return load_talker(tiny_dir, CPU, torch.float32)


def packed_modules(loaded: LoadedTalker) -> list[PackedLinear]:
    return [m for m in loaded.model.modules() if isinstance(m, PackedLinear)]


def test_tiny_weights_are_under_the_floor_and_stay_unpacked(tiny_dir: Path) -> None:
    loaded = load_talker(tiny_dir, CPU, torch.float32)
    assert not packed_modules(loaded)
    assert loaded.weights_bytes == sum(p.numel() * p.element_size() for p in loaded.model.parameters())


def test_an_engine_of_one_request_at_a_time_packs_nothing(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_batch 1: no batch ever reaches the packed copies, so they would be memory for nothing."""
    monkeypatch.setattr(linear, "PACK_MIN_ELEMENTS", 0)
    assert not packed_modules(load_talker(tiny_dir, CPU, torch.float32, batches=False))
    assert packed_modules(load_talker(tiny_dir, CPU, torch.float32, batches=True))


def test_every_layer_projection_and_head_is_packed_and_the_state_dict_is_unchanged(
    packed: LoadedTalker, tiny_dir: Path
) -> None:
    talker = packed.model.talker
    layers = [*talker.model.layers, *talker.code_predictor.model.layers]
    for layer in layers:
        assert isinstance(layer, DecoderLayer)
        attn, mlp = layer.self_attn, layer.mlp
        assert isinstance(attn.o_proj, PackedLinear) and isinstance(mlp.down_proj, PackedLinear)
        assert isinstance(getattr(attn.qkv, "__self__", None), PackedLinear)
        assert isinstance(getattr(mlp.gate_up, "__self__", None), PackedLinear)
    assert isinstance(talker.codec_head, PackedLinear)
    assert all(isinstance(h, PackedLinear) for h in talker.code_predictor.lm_head)
    # o, down and the heads are modules in the tree; q/k/v and gate/up are packed from the fused weights
    heads = 1 + len(talker.code_predictor.lm_head)
    assert len(packed_modules(packed)) == 2 * len(layers) + heads
    plain = load_talker(tiny_dir, CPU, torch.float32).model.state_dict()
    state = packed.model.state_dict()
    assert state.keys() == plain.keys()
    assert all(torch.equal(state[k], plain[k]) for k in plain)
    parameters = sum(p.numel() * p.element_size() for p in packed.model.parameters())
    assert packed.weights_bytes > parameters  # the packed copies are counted in the memory printed at start


def count_packed_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    kernel = torch.ops.mkldnn._linear_pointwise

    def counted(*args: object) -> torch.Tensor:
        calls[0] += 1
        return kernel(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counted)
    return calls


@pytest.mark.bitexact
def test_a_request_alone_never_reaches_the_packed_copies_and_gets_the_official_codes(
    oracle: Oracle, packed: LoadedTalker, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_packed_calls(monkeypatch)
    for case in oracle.cases:
        ((codes, hit_eos),) = run(packed, tiny_dir, [case], **GREEDY)
        assert_same_codes(case, codes, hit_eos, "alone, packed")
    assert calls[0] == 0  # prefill and decode of one request: F.linear, the official package's arithmetic


def test_a_batch_through_the_packed_copies_gives_each_its_official_codes(
    oracle: Oracle, packed: LoadedTalker, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case in one batch (more than 4 rows): the packed kernels round differently from F.linear, far less
    than the fixture's distance to a tie (test_oracle_parity checks that distance)."""
    calls = count_packed_calls(monkeypatch)
    assert len(oracle.cases) >= linear.PACKED_MIN_ROWS
    for case, (codes, hit_eos) in zip(oracle.cases, run(packed, tiny_dir, oracle.cases, **GREEDY), strict=True):
        assert_same_codes(case, codes, hit_eos, "batched, packed")
    assert calls[0] > 0

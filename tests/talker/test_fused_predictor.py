"""The fused code-predictor decode equals the plain decoder stack run over the whole frame at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from talker.models.loader import load_talker
from talker.models.qwen3_tts.fused_predictor import FusedPredictor
from talker.models.qwen3_tts.layers import sdpa


class CausalStore:
    """The reference: no cache, causal attention over the tokens given."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa(q, k, v, causal=True)


@pytest.mark.parametrize("batch", [1, 5])
def test_fused_steps_equal_one_causal_pass(tiny_dir: Path, batch: int) -> None:
    loaded = load_talker(tiny_dir, torch.device("cpu"), torch.float32)
    cp = loaded.model.talker.code_predictor
    groups = loaded.cfg.num_code_groups
    fused = FusedPredictor(cp, 8, groups + 1)
    h_talker = loaded.cfg.talker.hidden_size
    torch.manual_seed(0)
    tokens = torch.randn(batch, groups, h_talker)  # [B, T, H]: the Talker hidden, then one embedding per group
    with torch.inference_mode():
        stack = cp.model
        x = cp.small_to_mtp_projection(tokens)
        positions = torch.arange(groups).expand(batch, -1)
        want = stack.run(x, positions, CausalStore(), groups - 1)  # [B, T, H_pred]
        got = [fused.step(tokens[:, :2], 0)]
        got += [fused.step(tokens[:, t : t + 1], t) for t in range(2, groups)]
    for t, hidden in zip(range(1, groups), got, strict=True):
        torch.testing.assert_close(hidden, want[:, t], atol=2e-5, rtol=1e-4)


def test_fusion_keeps_the_modules_weights(tiny_dir: Path) -> None:
    loaded = load_talker(tiny_dir, torch.device("cpu"), torch.float32)
    cp = loaded.model.talker.code_predictor
    before = {k: v.clone() for k, v in cp.state_dict().items()}
    FusedPredictor(cp, 4, loaded.cfg.num_code_groups + 1)
    after = cp.state_dict()
    assert before.keys() == after.keys()
    for name, weight in before.items():
        assert torch.equal(weight, after[name]), name


def test_the_attention_runs_on_one_thread_and_the_workers_threads_are_put_back(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its matrices are tiny, and a parallel region waits for its slowest thread (a scheduler slice when the codec
    holds the other core), so the fused attention runs single-threaded inside a multi-threaded worker."""
    loaded = load_talker(tiny_dir, torch.device("cpu"), torch.float32)
    fused = FusedPredictor(loaded.model.talker.code_predictor, 4, loaded.cfg.num_code_groups + 1)
    seen: list[int] = []
    bmm = torch.bmm

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return bmm(a, b)

    monkeypatch.setattr(torch, "bmm", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            fused.step(torch.randn(3, 2, loaded.cfg.talker.hidden_size), 0)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}
    assert after == 2

import pytest
import torch

from talker.sampler import RowParams, apply_repetition_penalty, sample, step_uniforms

pytestmark = pytest.mark.bitexact  # exact token choices: scripts/test runs them under every CPU capability


def seeded(seed: int) -> torch.Generator:
    """Each test's random inputs come from their own seed: the same numbers alone, in any order, in any suite."""
    return torch.Generator().manual_seed(seed)


def _params(n: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, vocab: int = 64) -> RowParams:
    return RowParams.stack([temperature] * n, [top_k] * n, [top_p] * n, list(range(n)), vocab, torch.device("cpu"))


def test_uniforms_are_in_range_deterministic_and_row_independent() -> None:
    seeds, frames = torch.tensor([1, 2, 3]), torch.tensor([0, 5, 9])
    u = step_uniforms(seeds, frames, 16)
    assert u.shape == (3, 16) and bool(((u > 0) & (u < 1)).all())
    assert torch.equal(u, step_uniforms(seeds, frames, 16))
    alone = step_uniforms(seeds[1:2], frames[1:2], 16)
    assert torch.equal(alone[0], u[1])
    assert not torch.equal(u[0], step_uniforms(torch.tensor([1]), torch.tensor([1]), 16)[0])


def test_uniforms_look_uniform() -> None:
    u = step_uniforms(torch.arange(4000), torch.zeros(4000, dtype=torch.long), 4).flatten()
    assert abs(float(u.mean()) - 0.5) < 0.02
    hist = torch.histc(u, bins=10, min=0, max=1)
    assert float(hist.min()) > 0.8 * len(u) / 10


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 64, generator=seeded(1))
    tokens = sample(logits, _params(5, temperature=0.0), torch.rand(5, generator=seeded(2)))
    assert torch.equal(tokens, logits.argmax(-1))


def test_top_k_one_is_argmax_whatever_the_noise() -> None:
    logits = torch.randn(5, 64, generator=seeded(3))
    noise = torch.rand(5, generator=seeded(4))
    assert torch.equal(sample(logits, _params(5, top_k=1), noise), logits.argmax(-1))


def test_top_k_and_top_p_restrict_candidates() -> None:
    logits = torch.randn(200, 64, generator=seeded(5))
    u = step_uniforms(torch.arange(200), torch.zeros(200, dtype=torch.long), 1)[:, 0]
    top5 = logits.topk(5).indices
    tokens = sample(logits, _params(200, top_k=5), u)
    assert bool((tokens[:, None] == top5).any(-1).all())
    peaked = torch.zeros(200, 64)
    peaked[:, 7] = 10.0  # p(7) ~ 0.997: top_p 0.5 keeps only it
    assert bool((sample(peaked, _params(200, top_p=0.5), u) == 7).all())


@pytest.mark.parametrize("top_p", [1.0, 0.99])
def test_top_k_restricts_the_torch_path(top_p: float) -> None:
    """Rows with different k (and with top-p) take the torch path, not the host one: each row's token is among
    its own k best, and a flat distribution does reach past the smallest k."""
    logits = torch.randn(300, 64, generator=seeded(8)) * 0.1  # nearly flat: only top-k keeps a draw in the top
    ks = [3 if i % 2 else 10 for i in range(300)]
    params = RowParams.stack([1.0] * 300, ks, [top_p] * 300, list(range(300)), 64, torch.device("cpu"))
    u = step_uniforms(params.seeds, torch.zeros(300, dtype=torch.long), 1)[:, 0]
    tokens = sample(logits, params, u)
    rank = (logits > logits.gather(1, tokens[:, None])).sum(-1)  # 0 for the best
    assert bool((rank < torch.tensor(ks)).all())
    assert int(rank[0::2].max()) >= 3  # the k=10 rows use more than the k=3 rows' candidates


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (10, 1.0), (10, 0.99)])  # (10, 1.0): the numpy path
def test_sampling_follows_the_distribution(top_k: int, top_p: float) -> None:
    probs = torch.tensor([0.5, 0.3, 0.2] + [0.0] * 61)
    logits = (probs + 1e-9).log().expand(6000, -1).contiguous()
    u = step_uniforms(torch.arange(6000), torch.zeros(6000, dtype=torch.long), 1)[:, 0]
    tokens = sample(logits, _params(6000, top_k=top_k, top_p=top_p), u)
    counts = torch.bincount(tokens, minlength=64).float() / 6000
    assert torch.allclose(counts[:3], probs[:3], atol=0.03)


def test_host_path_keeps_greedy_rows_and_temperature() -> None:
    logits = torch.randn(400, 64, generator=seeded(6))
    temps = [0.0 if i % 4 == 0 else (0.05 if i % 4 == 1 else 1.0) for i in range(400)]
    params = RowParams.stack(temps, [20] * 400, [1.0] * 400, list(range(400)), 64, torch.device("cpu"))
    u = step_uniforms(params.seeds, torch.zeros(400, dtype=torch.long), 1)[:, 0]
    tokens = sample(logits, params, u)
    argmax = logits.argmax(-1)
    assert torch.equal(tokens[0::4], argmax[0::4])  # greedy rows
    assert float((tokens[1::4] == argmax[1::4]).float().mean()) > 0.9  # a cold temperature: nearly greedy
    assert float((tokens[2::4] == argmax[2::4]).float().mean()) < 0.5
    assert bool((tokens[:, None] == logits.topk(20).indices).any(-1).all())


def test_repetition_penalty_matches_hf_rule() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    out = apply_repetition_penalty(logits, seen, torch.tensor([[2.0]]))
    assert out.tolist() == [[1.0, -4.0, 1.0]]


@pytest.mark.parametrize("top_p", [0.8, 1.0])
@pytest.mark.parametrize("vocab", [64, 3072])
def test_batch_composition_does_not_change_a_row(vocab: int, top_p: float) -> None:
    logits = torch.randn(6, vocab, generator=seeded(7))
    params = RowParams.stack([0.9] * 6, [50] * 6, [top_p] * 6, [11, 12, 13, 14, 15, 16], vocab, torch.device("cpu"))
    u = step_uniforms(params.seeds, torch.full((6,), 3), 1)[:, 0]
    full = sample(logits, params, u)
    one = RowParams.stack([0.9], [50], [top_p], [13], vocab, torch.device("cpu"))
    assert int(sample(logits[2:3], one, u[2:3])[0]) == int(full[2])

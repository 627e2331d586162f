import pytest
import torch

from talker.sampler import RowParams, _mix32, _mul32, apply_repetition_penalty, sample, step_uniforms

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


def fmix32(x: int) -> int:
    """MurmurHash3's 32-bit finalizer, in Python integers: the reference for the tensor version."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_the_hash_helpers_are_32_bit_multiplication_and_murmur3s_finalizer() -> None:
    xs = [0, 1, 0xFFFF, 0x10000, 0xDEADBEEF, 0xFFFFFFFF, *torch.randint(0, 2**32, (200,), generator=seeded(9))]
    x = torch.tensor([int(v) for v in xs], dtype=torch.long)
    for c in (0x9E3779B1, 0x27D4EB2F, 0x85EBCA6B, 0xFFFFFFFF):
        assert _mul32(x, c).tolist() == [int(v) * c % 2**32 for v in xs]
    assert _mix32(x).tolist() == [fmix32(int(v)) for v in xs]


def test_a_seeds_draws_are_pinned() -> None:
    """A seeded request's audio is the same on every machine and every version: its draws are fixed numbers, on
    a grid of half steps of 2**-24 in (0, 1) (a change here changes every seeded output; update only on purpose)."""
    u = step_uniforms(torch.tensor([0, 1, 7, 2**40 + 3]), torch.tensor([0, 5, 1023, 2**33]), 3)
    assert (u * (1 << 24) - 0.5).tolist() == [[0, 10557614, 12375578], [2914454, 1957101, 1556138],
                                              [300483, 26925, 5858557], [7540261, 297849, 9454628]]


def _torch_path(n: int, ks: list[int], temps: list[float] | None = None, top_p: float = 0.99,
                vocab: int = 64) -> RowParams:
    """Top-p below 1 (or rows with different k) takes the torch path rather than the host one."""
    temps = temps or [1.0] * n
    return RowParams.stack(temps, ks, [top_p] * n, list(range(n)), vocab, torch.device("cpu"))


def test_the_torch_path_keeps_greedy_rows_greedy_in_a_sampled_batch() -> None:
    logits = torch.randn(300, 64, generator=seeded(10)) * 0.1  # nearly flat: a sampled row rarely hits the argmax
    logits[0::3, [7, 9]] = 5.0  # greedy rows with a tie at the top: greedy is the first, not a draw between them
    params = _torch_path(300, [50] * 300, [0.0 if i % 3 == 0 else 1.0 for i in range(300)])
    u = step_uniforms(params.seeds, torch.zeros(300, dtype=torch.long), 1)[:, 0]
    tokens, argmax = sample(logits, params, u), logits.argmax(-1)
    assert torch.equal(tokens[0::3], argmax[0::3]) and set(argmax[0::3].tolist()) == {7}
    assert float((tokens[1::3] == argmax[1::3]).float().mean()) < 0.5


def test_the_torch_path_reaches_every_kept_candidate() -> None:
    """Equal logits over exactly k tokens: each is drawn about 1/k of the time, the last kept one included."""
    logits = torch.full((3000, 64), -30.0)
    logits[:, [5, 9, 20]] = 0.0
    params = _torch_path(3000, [3] * 3000)
    u = step_uniforms(params.seeds, torch.zeros(3000, dtype=torch.long), 1)[:, 0]
    counts = torch.bincount(sample(logits, params, u), minlength=64).float() / 3000
    assert torch.allclose(counts[[5, 9, 20]], torch.full((3,), 1 / 3), atol=0.04)


def test_top_p_drops_a_candidate_whose_mass_before_it_reaches_p() -> None:
    """Two equally likely tokens and top_p 0.5: the mass before the second is exactly 0.5, so only the first stays
    (as in transformers' TopPLogitsWarper); ties keep the lower id first."""
    logits = torch.full((500, 64), -30.0)
    logits[:, [12, 40]] = 0.0
    params = _torch_path(500, [10] * 500, top_p=0.5)
    u = step_uniforms(params.seeds, torch.zeros(500, dtype=torch.long), 1)[:, 0]
    assert set(sample(logits, params, u).tolist()) == {12}


def test_repetition_penalty_divides_every_positive_logit() -> None:
    logits = torch.tensor([[0.5, -0.5, 0.0, 3.0]])
    out = apply_repetition_penalty(logits, torch.ones(1, 4, dtype=torch.bool), torch.tensor([[2.0]]))
    assert out.tolist() == [[0.25, -1.0, 0.0, 1.5]]

from collections.abc import Iterator

import pytest
import torch

from talker.sampler import RowParams, apply_repetition_penalty, sample, step_uniforms
from talker.sampler_native import SamplingKernel, load_sampling_kernel

pytestmark = pytest.mark.bitexact  # exact token choices: scripts/test runs them under every CPU capability
CPU = torch.device("cpu")


def seeded(seed: int) -> torch.Generator:
    """Each test's random inputs come from their own seed: the same numbers alone, in any order, in any suite."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def kernel() -> Iterator[SamplingKernel]:
    built = load_sampling_kernel()
    assert built is not None, "the install has no sampling kernel (setup.py builds it; see the log)"
    yield built


def _params(n: int, vocab: int, temperature: float = 0.9, top_k: int = 50, top_p: float = 1.0) -> RowParams:
    return RowParams.stack([temperature] * n, [top_k] * n, [top_p] * n, list(range(n)), vocab, CPU)


def _u(n: int, frame: int = 0) -> torch.Tensor:
    return step_uniforms(torch.arange(n), torch.full((n,), frame), 1)[:, 0]


def test_greedy_and_top_k_one_are_argmax(kernel: SamplingKernel) -> None:
    logits = torch.randn(40, 2048, generator=seeded(1))
    assert torch.equal(kernel.sample(logits, _params(40, 2048, temperature=0.0), _u(40)), logits.argmax(-1))
    assert torch.equal(kernel.sample(logits, _params(40, 2048, top_k=1), _u(40)), logits.argmax(-1))


@pytest.mark.parametrize(("vocab", "top_k", "top_p"), [(2048, 50, 0.95), (3072, 50, 0.8), (64, 20, 0.9),
                                                       (64, 0, 0.5), (2048, 200, 0.9), (2050, 50, 0.9)])
def test_with_top_p_it_picks_what_the_torch_path_picks(kernel: SamplingKernel, vocab: int, top_k: int,
                                                       top_p: float) -> None:
    # top-p walks candidates best first, as the torch path does: the same uniform gives the same token
    logits = torch.randn(300, vocab, generator=seeded(2))
    params = _params(300, vocab, top_k=top_k, top_p=top_p)
    assert torch.equal(kernel.sample(logits, params, _u(300)), sample(logits, params, _u(300)))


def test_repetition_penalty_is_the_hf_rule(kernel: SamplingKernel) -> None:
    logits = torch.randn(300, 2048, generator=seeded(3)) * 3
    seen = torch.rand(300, 2048, generator=seeded(4)) < 0.2
    penalty = torch.full((300, 1), 1.3)
    params = _params(300, 2048, top_p=0.9)
    want = sample(apply_repetition_penalty(logits, seen, penalty), params, _u(300))
    assert torch.equal(kernel.sample(logits, params, _u(300), seen, penalty), want)
    greedy = _params(300, 2048, temperature=0.0)
    want = apply_repetition_penalty(logits, seen, penalty).argmax(-1)
    assert torch.equal(kernel.sample(logits, greedy, _u(300), seen, penalty), want)


def test_without_top_p_it_draws_from_the_same_distribution(kernel: SamplingKernel) -> None:
    n, vocab = 20000, 2048
    logits = torch.randn(1, vocab, generator=seeded(5)).expand(n, -1).contiguous()
    params = _params(n, vocab)
    ours = torch.bincount(kernel.sample(logits, params, _u(n)), minlength=vocab).float() / n
    reference = torch.bincount(sample(logits, params, _u(n)), minlength=vocab).float() / n
    assert set(ours.nonzero()[:, 0].tolist()) <= set(logits[0].topk(50).indices.tolist())
    assert float((ours - reference).abs().max()) < 0.015


def test_ties_at_the_cut_keep_the_lower_ids(kernel: SamplingKernel) -> None:
    logits = torch.zeros(2000, 64)
    logits[:, 40] = 1.0  # one best, then 63 tied: top-4 keeps 40 and ids 0, 1, 2
    tokens = kernel.sample(logits, _params(2000, 64, temperature=1.0, top_k=4), _u(2000))
    assert set(tokens.tolist()) == {0, 1, 2, 40}


def test_suppressed_logits_are_never_drawn(kernel: SamplingKernel) -> None:
    logits = torch.randn(500, 3072, generator=seeded(6))
    logits[:, 2048:] = float("-inf")
    tokens = kernel.sample(logits, _params(500, 3072, top_k=50), _u(500))
    assert bool((tokens < 2048).all())


def test_a_row_does_not_depend_on_its_batch(kernel: SamplingKernel) -> None:
    logits = torch.randn(6, 2048, generator=seeded(7))
    temps, ks = [0.9, 0.0, 0.7, 1.2, 0.9, 0.5], [50, 50, 10, 2048, 30, 50]
    params = RowParams.stack(temps, ks, [1.0] * 6, list(range(6)), 2048, CPU)
    u = step_uniforms(params.seeds, torch.full((6,), 3), 2)[:, 1]  # a strided column, as the runner passes
    full = kernel.sample(logits, params, u)
    for i in range(6):
        one = RowParams.stack(temps[i : i + 1], ks[i : i + 1], [1.0], [i], 2048, CPU)
        assert int(kernel.sample(logits[i : i + 1], one, u[i : i + 1])[0]) == int(full[i])


def test_bad_inputs_are_refused(kernel: SamplingKernel) -> None:
    params = _params(2, 64)
    with pytest.raises(ValueError, match="float32"):
        kernel.sample(torch.randn(2, 64, generator=seeded(8)).double(), params, _u(2))
    with pytest.raises(ValueError, match="together"):
        logits = torch.randn(2, 64, generator=seeded(9))
        kernel.sample(logits, params, _u(2), seen=torch.zeros(2, 64, dtype=torch.bool))


def test_an_install_without_the_kernel_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("talker.sampler_native.MODULE", "talker._no_such_kernel")
    assert load_sampling_kernel() is None

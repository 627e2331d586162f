"""The static programs' projections: a row's result is the one it gets alone, at a real checkpoint's layer sizes (a
library's kernel choice changes with the rows), and the int8 form is `Int8Linear`'s arithmetic, compiled or not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from talker.models.qwen3_tts.linear import Int8Linear, PackedLinear
from talker.models.qwen3_tts.static_linear import LOOPS_MAX_ELEMENTS, static_linear

SHAPES = [(2048, 1024), (1024, 3072)]  # (out, in) of the 0.6B Talker's o and down projections


def weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) / k**0.5, torch.randn(n, generator=g), torch.randn(8, k, generator=g)


def linear(w: torch.Tensor, b: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    return lin


def assert_rows_as_alone(project: object, x: torch.Tensor) -> None:
    alone = [project(x[i : i + 1]) for i in range(x.shape[0])]  # type: ignore[operator]
    for m in (2, 3, 4, 8):
        together = project(x[:m])  # type: ignore[operator]
        for i in range(m):
            assert torch.equal(together[i], alone[i][0]), f"row {i} of {m} differs from the row alone"
    assert torch.equal(project(x[:1, None])[:, 0], alone[0])  # type: ignore[operator]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("packed", [False, True], ids=["linear", "packed-linear"])
def test_a_float32_rows_result_does_not_depend_on_the_rows_beside_it(shape: tuple[int, int], packed: bool) -> None:
    w, b, x = weights(*shape)
    assert w.numel() >= LOOPS_MAX_ELEMENTS  # the library call, not the compiler's loops
    module = PackedLinear(w, b) if packed else linear(w, b)
    project = static_linear(module)
    assert project.key >= 0
    assert_rows_as_alone(project, x)
    assert torch.allclose(project(x), F.linear(x, w, b), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.filterwarnings(r"ignore::DeprecationWarning:torch(\.|$)")  # the compiler on torch's own parts
def test_int8_is_the_int8_linears_arithmetic_bit_for_bit_compiled_or_not(shape: tuple[int, int]) -> None:
    w, b, x = weights(*shape)
    x[1] *= 1000.0  # a loud row beside quiet ones
    q = Int8Linear(w, b)
    project = static_linear(q)
    assert project.sentinel is not None
    assert_rows_as_alone(project, x)
    assert torch.equal(project(x), q(x))
    compiled = torch.compile(project.__call__, fullgraph=True, dynamic=False)
    for m in (1, 4):
        assert torch.equal(compiled(x[:m]), q(x[:m]))


def test_a_small_weight_runs_in_the_compilers_loops() -> None:
    w, b, x = weights(64, 32)
    project = static_linear(linear(w, b))
    assert project.key < 0 and project.loops
    assert_rows_as_alone(project, x)
    assert torch.allclose(project(x), F.linear(x, w, b), atol=1e-5)

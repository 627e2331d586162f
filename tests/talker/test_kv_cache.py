"""The Talker's slot KV cache: a decode step attends to each row's own slot, whether the rows' slots are gathered
or (consecutive, in order) read as a view of the cache."""

from __future__ import annotations

import pytest
import torch

from talker.kv_cache import SlotKVCache
from talker.runner import consecutive


def test_consecutive_slots_are_a_span() -> None:
    assert consecutive([3]) == (3, 1) and consecutive([2, 3, 4]) == (2, 3)
    assert consecutive([]) is None and consecutive([2, 4]) is None and consecutive([3, 2]) is None


@pytest.mark.bitexact
@pytest.mark.parametrize("slots", [[1], [0, 1, 2], [2, 3]])
def test_a_view_of_consecutive_slots_attends_as_the_gather_does(slots: list[int]) -> None:
    gen = torch.Generator().manual_seed(5)
    outs = []
    for span in (None, consecutive(slots)):
        kv = SlotKVCache(2, 4, 2, 32, 8, torch.float32, torch.device("cpu"))
        kv.k.normal_(generator=gen.manual_seed(1))
        kv.v.normal_(generator=gen.manual_seed(2))
        b = len(slots)
        positions = torch.tensor([20 - 3 * i for i in range(b)])
        q = torch.randn(b, 4, 1, 8, generator=gen.manual_seed(3))
        k, v = torch.randn(2, b, 2, 1, 8, generator=gen.manual_seed(4))
        view = kv.for_decode(torch.tensor(slots), positions, int(positions.max()) + 1, span)
        outs.append((view.attend(1, q, k, v), kv.k.clone(), kv.v.clone()))
    (got, gk, gv), (want, wk, wv) = outs[1], outs[0]
    assert torch.equal(got, want) and torch.equal(gk, wk) and torch.equal(gv, wv)
    # the rows see their own slots: a row's keys past its position are masked, its own new key is used
    assert not torch.equal(got[0], torch.zeros_like(got[0]))

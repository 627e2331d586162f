"""The op counter sees what a step would make the host wait for, and a steady step on the CPU path has none."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks.op_count import OpCount
from benchmarks.step_gap import measure
from engine.config import EngineConfig


def test_it_counts_calls_host_syncs_and_uploads() -> None:
    x = torch.arange(6.0)
    with OpCount() as count:
        y = x * 2 + 1  # two calls, nothing read back
    assert count.ops == 2 and not count.syncs and count.uploads == 0
    with OpCount() as count:
        float(y.sum())  # .item()
        bool(y[0] > 1)  # a tensor as a condition
        y.nonzero()  # an output shape that depends on the data
        torch.tensor([1.0, 2.0])  # a tensor from Python data
        y[0] = 3.0  # a scalar goes by value: not an upload
    assert sum(count.syncs.values()) == 3 and count.syncs["nonzero"] == 1
    assert count.uploads == 1


@pytest.mark.parametrize("batch", [1, 4])
def test_a_steady_cpu_step_reads_nothing_back(tiny_cache: Path, engine_config: EngineConfig, batch: int) -> None:
    out = measure(replace(engine_config, cache_dir=tiny_cache), batch)
    assert out["ops_per_step"] > 100 and out["batch"] == batch
    assert out["host_syncs_per_step"] == 0, out["host_syncs_by_op"]

"""Fixtures shared by the Talker tests that compare with the official package's recorded outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.talker.oracle_fixture import Oracle, load_oracle, stale_reason


@pytest.fixture(scope="session")
def oracle(tiny_dir: Path) -> Oracle:
    """The official package's greedy outputs for the tiny checkpoint."""
    reason = stale_reason(tiny_dir)
    if reason:  # a fail, not a skip: stale fixtures would otherwise make every parity test vanish unnoticed
        pytest.fail(reason)
    return load_oracle()

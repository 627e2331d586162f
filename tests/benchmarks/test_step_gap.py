"""`talkstream bench step-gap` (through the command line): both output modes on one workload, with the same audio
and the same codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import __main__ as bench
from benchmarks import step_gap as bench_step_gap


def test_both_modes_agree_and_the_timeline_is_written(tiny_cache: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    svg = tmp_path / "timeline.svg"
    assert bench.main(["step-gap", "--batch", "3", "--steps", "24", "--svg", str(svg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["identical"] and out["identical_codes"] and out["max_sample_diff"] == 0
    assert out["sync"]["steps"] > 0 and out["async"]["gap_us_p50"] > 0
    assert out["ops_per_step"] > 100 and out["host_syncs_per_step"] == 0  # a steady CPU step reads nothing back
    assert svg.read_text().startswith("<svg")


def test_identical_needs_output_on_both_sides() -> None:
    """Two runs that made nothing (or a request that made nothing) are not evidence that the modes agree."""
    assert bench_step_gap.identical([b"ab", b"c"], [b"ab", b"c"])
    assert not bench_step_gap.identical([], [])
    assert not bench_step_gap.identical([b""], [b""])
    assert not bench_step_gap.identical([b"ab", b""], [b"ab", b""])
    assert not bench_step_gap.identical([b"ab"], [b"ac"])
    assert not bench_step_gap.identical([b"ab"], [b"ab", b"c"])

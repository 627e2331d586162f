"""`talkstream bench step-gap`: both output modes on one workload, with the same audio and the same codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server import bench_step_gap


def test_both_modes_agree_and_the_timeline_is_written(tiny_cache: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    svg = tmp_path / "timeline.svg"
    assert bench_step_gap.main(["--batch", "3", "--steps", "24", "--svg", str(svg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["identical"] and out["identical_codes"] and out["max_sample_diff"] == 0
    assert out["sync"]["steps"] > 0 and out["async"]["gap_us_p50"] > 0
    assert svg.read_text().startswith("<svg")

"""`talkstream bench aligner` (through the command line, at small sizes): it times the tiny aligner and runs streams
with and without timestamps beside the Talker, printing each figure and the whole result as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import __main__ as bench


def test_bench_aligner_prints_its_figures(capsys: pytest.CaptureFixture[str], tiny_cache: Path, tiny_dir: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    args = ["aligner", "--sizes", "tiny", "--beside", "tiny", "--streams", "2", "--frames", "12",
            "--rounds", "1", "--json"]
    assert bench.main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    assert set(out["alignment"]["tiny"]) == {"2s", "5s", "10s", "4x5s"}
    assert all(row["s_per_audio_s"] > 0 for row in out["alignment"]["tiny"].values())
    beside = out["beside_the_talker"]["tiny"]
    assert beside["with"]["timestamps_after_audio_ms_p50"] >= 0
    assert "timestamps_after_audio_ms_p50" not in beside["without"]
    assert any(line.startswith("2 streams, aligner tiny, with") for line in lines)

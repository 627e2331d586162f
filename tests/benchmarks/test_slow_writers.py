"""`talkstream bench slow-writers` (through the command line), small: its figures are there and its writers all
completed, which they can only do if the ordinary requests were served while the writers held their responses open
(the writers commit only after the last ordinary request)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import __main__ as bench


def test_it_prints_its_figures_and_the_writers_complete(tiny_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    assert bench.main(["slow-writers", "--slots", "1", "--requests", "2", "--word-every-s", "0.5",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["beside_slow_writers"]["writers_completed"] == 1
    for round_ in (out["alone"], out["beside_slow_writers"]):
        assert 0 < round_["first_audio_ms_p50"] <= round_["first_audio_ms_max"]
    assert out["first_audio_ratio"] > 0

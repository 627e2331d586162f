"""`talkstream bench text-stream` (through the command line), on a short text: the figures it prints are there and
say what the tests elsewhere check (the same audio as the whole text, every session whole, a row per frame)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import __main__ as bench
from benchmarks import text_stream as bench_text_stream
from benchmarks.text_stream import Run


def test_it_prints_its_figures_and_they_hold(tiny_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    assert bench.main(["text-stream", "--words", "6", "--sessions", "4", "--stagger-ms", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for alone in (out["fast"], out["slow"]):
        assert alone["identical_to_whole_text"] and alone["whole"] and not alone["errors"]
        assert alone["first_audio_ms"] is not None and alone["first_audio_ms"] > 0
    crowd = out["crowd"]
    assert crowd["whole_audio"] == crowd["sessions"] == 4 and crowd["errors"] == 0
    assert crowd["talker_rows"] == crowd["frames_plus_eos"]


def test_playback_counts_the_stalls_of_a_player_that_starts_at_its_first_audio() -> None:
    second = 48000  # bytes of one second of audio
    run = Run(1.0, ["x"], deltas=[(0.0, second), (1.0, second), (2.5, second), (2.6, second)])
    assert bench_text_stream.playback(run) == {"stalls": 1, "stall_ms": 500.0, "buffer_needed_ms": 500.0}

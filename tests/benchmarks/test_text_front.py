"""`talkstream bench text-front` (through the command line): it prints each text's costs, and the languages it
detected are the texts' own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import __main__ as bench


def test_it_prints_the_front_ends_costs(tiny_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    assert bench.main(["text-front", "--repeat", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    texts = out["texts"]
    assert set(texts) == {"english_short", "chinese_short", "english_numbers", "chinese_numbers", "english_4096",
                          "mixed_4096"}
    assert texts["english_short"]["detected"] == ["english"] and texts["chinese_short"]["detected"] == ["chinese"]
    assert {"english", "chinese"} <= set(texts["mixed_4096"]["detected"])
    for r in texts.values():
        assert r["segments"] >= 1 and all(r[k] > 0 for k in ("prepare_detected_us", "prepare_named_us",
                                                             "lexicon_1000_us", "pause_tags_us", "normalize_us"))

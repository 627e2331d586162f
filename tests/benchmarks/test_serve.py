"""`talkstream bench serve` against the shared live server: a load of HTTP and Realtime streams at each concurrency,
its figures printed, JSON last."""

from __future__ import annotations

import json

import pytest

from benchmarks import __main__ as bench
from tests.server.conftest import LiveServer


def test_bench_serve_prints_json_last(live: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(["serve", "--url", live.url, "--concurrency", "1,2", "--requests", "2",
                     "--protocol", "http,ws", "--text", "A short benchmark sentence.", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    levels = result["levels"]
    assert [(lv["protocol"], lv["concurrency"]) for lv in levels] == [("http", 1), ("http", 2), ("ws", 1), ("ws", 2)]
    for level in levels:
        assert level["failures"] == 0 and level["requests"] == 2
        assert level["ttfa_ms_p50"] > 0 and level["rtf_p50"] > 0 and level["audio_s_per_s"] > 0


def test_bench_serve_staggers_the_streams_starts(live: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(["serve", "--url", live.url, "--concurrency", "2", "--requests", "2", "--protocol", "ws",
                     "--text", "Hi.", "--stagger-ms", "400", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["stagger_ms"] == 400
    assert result["levels"][0]["wall_s"] >= 0.4  # the second stream started 400 ms after the first

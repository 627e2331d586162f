"""`talkstream` commands: say (remote and --local), export-tiny, bench serve, and the argument parser."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from server import cli
from tests.server.audio import seconds
from tests.server.conftest import LiveServer


def test_say_remote_writes_a_valid_wav(live: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    assert cli.main(["say", "Hello from the command line.", "-o", str(out), "--url", live.url, "--seed", "1"]) == 0
    data, rate = sf.read(out)  # the streamed header's sizes were patched to the real ones
    assert rate == 24000 and data.ndim == 1 and data.size / rate > 0.5


def test_say_writes_a_flac_that_states_its_length(live: LiveServer, tmp_path: Path) -> None:
    out, text = tmp_path / "hello.flac", "Hello in lossless audio."
    assert cli.main(["say", text, "-o", str(out), "--url", live.url, "--seed", "3"]) == 0
    same = {"model": "tts-1", "input": text, "voice": "alloy", "speed": 1.0, "seed": 3}  # what `say` sends
    pcm = httpx.post(live.url + "/v1/audio/speech", json={**same, "response_format": "pcm"}, timeout=60)
    assert pcm.status_code == 200
    data, rate = sf.read(out)  # libsndfile needs the total length in STREAMINFO
    assert rate == 24000 and data.ndim == 1 and data.size == len(pcm.content) // 2 > 0


def test_say_format_from_extension(live: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "hello.mp3"
    assert cli.main(["say", "Hello again.", "-o", str(out), "--url", live.url, "--voice", "ben"]) == 0
    assert seconds(out.read_bytes(), "mp3") > 0.3


def test_say_reports_server_errors(live: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["say", "Hi.", "-o", str(tmp_path / "x.wav"), "--url", live.url, "--voice", "nobody"])
    assert code == 2
    assert "unknown voice" in capsys.readouterr().err


def test_say_local(tiny_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    monkeypatch.setenv("TALKSTREAM_WARMUP", "0")
    out = tmp_path / "local.flac"
    assert cli.main(["say", "Hello in process.", "-o", str(out), "--local", "--device", "cpu", "--seed", "2"]) == 0
    assert seconds(out.read_bytes(), "flac") > 0.5  # a streamed FLAC has no length in its header: decode it


def test_export_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["export-tiny", str(tmp_path / "tiny")]) == 0
    assert (tmp_path / "tiny" / "config.json").is_file()
    assert (tmp_path / "tiny" / "model.safetensors").is_file()


def test_bench_serve_prints_json_last(live: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "serve", "--url", live.url, "--concurrency", "1,2", "--requests", "2",
                     "--protocol", "http,ws", "--text", "A short benchmark sentence.", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    levels = result["levels"]
    assert [(lv["protocol"], lv["concurrency"]) for lv in levels] == [("http", 1), ("http", 2), ("ws", 1), ("ws", 2)]
    for level in levels:
        assert level["failures"] == 0 and level["requests"] == 2
        assert level["ttfa_ms_p50"] > 0 and level["rtf_p50"] > 0 and level["audio_s_per_s"] > 0


def test_bench_serve_staggers_the_streams_starts(live: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "serve", "--url", live.url, "--concurrency", "2", "--requests", "2", "--protocol", "ws",
                     "--text", "Hi.", "--stagger-ms", "400", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["stagger_ms"] == 400
    assert result["levels"][0]["wall_s"] >= 0.4  # the second stream started 400 ms after the first


def test_serve_flags_parse() -> None:
    args = cli.parser().parse_args(["serve", "--model", "tiny", "--port", "9000", "--device", "cpu",
                                    "--output-mode", "sync", "--max-batch", "4", "--max-queue", "2",
                                    "--api-key", "k", "--shutdown-timeout", "3"])
    config = cli.engine_config(args)
    assert (config.max_batch, config.max_queue, config.output_mode.value) == (4, 2, "sync")
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 9000, "k")


def test_serve_rejects_a_missing_model_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--model", str(tmp_path / "nope")]) == 2
    assert "checkpoint directory" in capsys.readouterr().err

"""`talkstream` commands: serve's wiring, say (remote and --local) with its options, export-tiny (both sizes), bench
serve, and the argument parser."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from engine.config import EngineConfig
from server import cli
from server.http_protocol import default_max_connections
from server.ray import cli as cli_ray
from tests.server.conftest import LiveServer
from tests.server.pcm import seconds


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


def test_say_prints_the_text_as_it_was_read_out(live: LiveServer, tmp_path: Path, tiny_cache: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    text = "The weather is lovely, and it is 42% off today."
    assert cli.main(["say", text, "-o", str(tmp_path / "x.wav"), "--url", live.url]) == 0
    said = "said (english): The weather is lovely, and it is forty-two percent off today."
    assert said in capsys.readouterr().err
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    monkeypatch.setenv("TALKSTREAM_TUNING", "warmup=0")
    assert cli.main(["say", text, "-o", str(tmp_path / "y.wav"), "--local", "--device", "cpu"]) == 0
    assert said in capsys.readouterr().err


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
    monkeypatch.setenv("TALKSTREAM_TUNING", "warmup=0")
    out = tmp_path / "local.flac"
    assert cli.main(["say", "Hello in process.", "-o", str(out), "--local", "--device", "cpu", "--seed", "2"]) == 0
    assert seconds(out.read_bytes(), "flac") > 0.5  # a streamed FLAC has no length in its header: decode it


def test_export_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["export-tiny", str(tmp_path / "tiny")]) == 0
    assert (tmp_path / "tiny" / "config.json").is_file()
    assert (tmp_path / "tiny" / "model.safetensors").is_file()


def test_talkstream_bench_hands_over_to_the_benchmarks_own_command() -> None:
    """`talkstream bench` runs `python -m benchmarks` (the server never imports them: they import the server)."""
    listed = subprocess.run([sys.executable, "-m", "server.cli", "bench", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and "step-gap" in listed.stdout and "aligner" in listed.stdout
    wrong = subprocess.run([sys.executable, "-m", "server.cli", "bench", "nope"], capture_output=True, text=True,
                           timeout=60)
    assert wrong.returncode == 2 and "invalid choice: 'nope'" in wrong.stderr


def test_serve_flags_parse() -> None:
    args = cli.parser().parse_args(["serve", "--model", "tiny", "--port", "9000", "--device", "cpu",
                                    "--output-mode", "sync", "--max-batch", "4", "--max-queue", "2",
                                    "--api-key", "k", "--shutdown-timeout", "3", "--quantize", "int8"])
    config = cli.engine_config(args)
    assert (config.max_batch, config.max_queue, config.output_mode.value) == (4, 2, "sync")
    assert config.quantize == "int8"
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 9000, "k")


def test_serve_rejects_a_missing_model_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--model", str(tmp_path / "nope")]) == 2
    assert "checkpoint directory" in capsys.readouterr().err


def test_serve_flags_and_the_api_key_variable_reach_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """`talkstream serve`'s wiring, without a server: what reaches create_app and the server runner."""
    import server.app
    import server.drain

    made: dict[str, Any] = {}

    def create_app(configs: list[EngineConfig], api_key: str | None, **options: Any) -> object:
        made.update(configs=configs, api_key=api_key, **options)
        return object()

    class Runner:
        def __init__(self, config: Any, state: Any, timeout: float) -> None:
            made["uvicorn"], made["drain_timeout"] = config, timeout

        def run(self) -> None:
            made["ran"] = True

    monkeypatch.setattr(server.app, "create_app", create_app)
    monkeypatch.setattr(server.drain, "DrainingServer", Runner)
    monkeypatch.setattr("server.state.state_of", lambda app: None)
    monkeypatch.setenv("TALKSTREAM_API_KEY", "from-the-environment")
    monkeypatch.setenv("TALKSTREAM_MAX_BATCH", "5")
    monkeypatch.setenv("TALKSTREAM_MAX_QUEUE", "7")
    assert cli.main(["serve", "--cors-origins", "https://a.example, https://b.example", "--log-input",
                     "--codec-timeout", "7.5", "--shutdown-timeout", "4", "--port", "9123", "--max-connections", "11",
                     "--max-batch", "3", "--data-dir", "/srv/voices"]) == 0
    assert made["ran"] and made["api_key"] == "from-the-environment" and made["data_dir"] == Path("/srv/voices")
    assert made["cors_origins"] == ["https://a.example", "https://b.example"] and made["log_input"] is True
    [config] = made["configs"]
    assert config.tuning.codec_timeout_s == 7.5
    assert (config.max_batch, config.max_queue) == (3, 7)  # flags win over the environment, which wins over defaults
    assert made["shutdown_timeout"] == made["drain_timeout"] == 4
    assert (made["uvicorn"].port, made["uvicorn"].limit_concurrency) == (9123, 11)
    made.clear()
    assert cli.main(["serve", "--api-key", "from-the-flag"]) == 0  # a flag wins over the environment
    assert made["api_key"] == "from-the-flag" and made["cors_origins"] is None and made["log_input"] is False
    assert made["data_dir"] is None  # create_app's default: TALKSTREAM_DATA_DIR, XDG_DATA_HOME, ~/.local/share
    assert made["uvicorn"].limit_concurrency == default_max_connections()  # half the open-file limit


SAY = {"voice": "ben", "speed": 2.0, "seed": 5, "instructions": "Speak calmly."}


def test_say_sends_each_of_its_options(live: LiveServer, tmp_path: Path) -> None:
    """The file `say` writes is what a request with its options gets, and each option changes that audio (so a
    dropped one would show). Not the voice: the tiny model's random weights give every speaker the same audio, so
    test_say_reports_server_errors shows that --voice reaches the server."""
    text, out = "Options, all of them.", tmp_path / "options.audio"
    assert cli.main(["say", text, "-o", str(out), "--url", live.url, "--format", "pcm", "--voice", "ben",
                     "--speed", "2", "--seed", "5", "--instructions", "Speak calmly."]) == 0

    def served(**fields: Any) -> bytes:
        body = {"model": "tts-1", "input": text, "response_format": "pcm", **fields}
        resp = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=60)
        assert resp.status_code == 200
        return resp.content

    assert out.read_bytes() == served(**SAY)
    for name, other in (("speed", 1.0), ("seed", 6), ("instructions", None)):
        changed = {k: v for k, v in {**SAY, name: other}.items() if v is not None}
        assert served(**changed) != out.read_bytes(), name


def test_say_local_sends_each_of_its_options(tiny_cache: Path, tmp_path: Path, live: LiveServer,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """--local runs its own engine with the same options: the same audio as the server's, for a format named by
    --format (the file's extension says nothing)."""
    monkeypatch.setenv("TALKSTREAM_CACHE_DIR", str(tiny_cache))
    monkeypatch.setenv("TALKSTREAM_TUNING", "warmup=0")
    text, out = "Options, all of them.", tmp_path / "local.audio"
    assert cli.main(["say", text, "-o", str(out), "--local", "--device", "cpu", "--format", "pcm", "--voice", "ben",
                     "--speed", "2", "--seed", "5", "--instructions", "Speak calmly."]) == 0
    resp = httpx.post(live.url + "/v1/audio/speech", timeout=60,
                      json={"model": "tts-1", "input": text, "response_format": "pcm", **SAY})
    assert resp.status_code == 200 and len(resp.content) > 0
    assert out.read_bytes() == resp.content


def test_export_tiny_at_the_0_6b_size_writes_a_checkpoint_the_loader_takes(tmp_path: Path) -> None:
    """`talkstream export-tiny DIR --size 0.6b`: Qwen3-TTS-12Hz-0.6B's layer sizes in config.json, and weights whose
    names and shapes are the ones the loader builds from it (checked from the file's header: 2.4 GB not read)."""
    from safetensors import safe_open

    from talker.models.qwen3_tts.config import Qwen3TTSConfig
    from talker.models.qwen3_tts.model import Qwen3TTSModel

    out = tmp_path / "big"
    assert cli.main(["export-tiny", str(out), "--size", "0.6b"]) == 0
    cfg = Qwen3TTSConfig.load(out)  # as load_talker reads it
    assert (cfg.talker.num_layers, cfg.talker.hidden_size, cfg.talker.num_heads, cfg.talker.num_kv_heads) == (
        28, 1024, 16, 8)
    assert (cfg.predictor.num_layers, cfg.predictor.hidden_size) == (5, 1024)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Qwen3TTSModel(cfg).state_dict().items()}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        written = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
    assert written == expected
    assert sum(n for shape in written.values() for n in [int(np.prod(shape))]) > 400_000_000
    assert (out / "speech_tokenizer" / "config.json").is_file() and (out / "tokenizer.json").is_file()


def test_serve_ray_without_ray_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Ray is an optional extra: without it `serve --ray` says how to get it, and nothing else starts."""
    for name in ("ray", "ray.serve", "server.ray.app"):  # as if not installed (None in sys.modules: ImportError)
        monkeypatch.setitem(sys.modules, name, None)
    assert cli.main(["serve", "--ray", "--replicas", "2"]) == 2
    assert capsys.readouterr().err == f"talkstream: error: {cli_ray.MISSING}\n"

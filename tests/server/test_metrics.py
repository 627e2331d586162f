"""Listings, health (starting, ready, dead), OpenAPI docs and Prometheus metrics; a disconnect mid-stream frees its
slot."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from engine import engine as engine_module
from engine.config import EngineConfig
from server.app import create_app
from server.state import state_of
from tests.server.conftest import LiveServer

LONG_TEXT = "This sentence keeps going on and on so that the audio lasts for a good while. " * 12


def scrape(client: httpx.Client) -> dict[str, float]:
    """Sample name (with sorted labels) → value."""
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_health_and_listings(live: LiveServer, client: httpx.Client) -> None:
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    models = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert models[0] == live.engine.model_id and {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(models)
    voices = client.get("/v1/audio/voices").json()
    names = {v["id"] for v in voices["data"]}
    assert {"alloy", "nova"} <= names and set(live.engine.voices) == names
    assert "english" in voices["languages"]


def test_health_is_503_until_started_and_when_the_model_fails(
    make_server: Callable[..., LiveServer], server_config: EngineConfig, tmp_path: Path,
) -> None:
    assert state_of(create_app(server_config)).status == "starting"  # before the lifespan runs
    broken = make_server(wait_ready=False, model=str(tmp_path))  # a directory without a checkpoint
    deadline = time.monotonic() + 30
    while True:
        try:
            health = httpx.get(broken.url + "/health", timeout=5)
            if health.json()["status"] == "dead" or time.monotonic() > deadline:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    assert health.status_code == 503 and health.json()["detail"]
    assert int(health.headers["retry-after"]) >= 1
    resp = httpx.post(broken.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "alloy"})
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "server_error"


def test_openapi_docs(client: httpx.Client) -> None:
    assert client.get("/docs").status_code == 200
    schema = client.get("/openapi.json").json()
    assert "/v1/audio/speech" in schema["paths"]
    codes = [code for path in schema["paths"].values() for op in path.values() for code in op.get("responses", {})]
    assert "422" not in codes and "400" in codes


def test_metrics_after_traffic(live: LiveServer, client: httpx.Client) -> None:
    before = scrape(client)
    ok = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Count this.", "voice": "alloy",
                                               "response_format": "mp3"})
    assert ok.status_code == 200
    assert client.post("/v1/audio/speech", json={"model": "tts-1"}).status_code == 400
    after = scrape(client)
    assert after["talkstream_time_to_first_audio_seconds_count{protocol=http}"] >= 1
    assert after["talkstream_step_seconds_count"] > before.get("talkstream_step_seconds_count", 0)
    assert after["talkstream_step_gap_seconds_count"] > 0
    assert after["talkstream_audio_seconds_total{protocol=http}"] > before.get(
        "talkstream_audio_seconds_total{protocol=http}", 0)
    key = "talkstream_errors_total{code=missing_field,type=invalid_request_error}"
    assert after[key] == before.get(key, 0) + 1
    for gauge in ("active_requests", "queued_requests", "slots_in_use", "codec_jobs_in_flight", "open_encoders"):
        assert after[f"talkstream_{gauge}"] == 0, gauge
    assert after["talkstream_engine_ready"] == 1


def test_disconnect_mid_stream_frees_the_slot(live: LiveServer, client: httpx.Client) -> None:
    payload = {"model": "tts-1", "input": LONG_TEXT, "voice": "alloy", "response_format": "mp3", "temperature": 0.0}
    cancelled = scrape(client).get("talkstream_requests_total{outcome=cancelled,protocol=http}", 0)
    with client.stream("POST", "/v1/audio/speech", json=payload) as resp:
        body = resp.iter_raw()
        next(body)
        next(body)
        assert live.stats()["slots_in_use"] == 1
    deadline = time.monotonic() + 10.0  # a failure timeout only
    while True:
        metrics = scrape(client)
        idle = all(metrics[f"talkstream_{g}"] == 0 for g in ("active_requests", "slots_in_use", "open_encoders"))
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert idle, metrics
    assert metrics["talkstream_requests_total{outcome=cancelled,protocol=http}"] == cancelled + 1


def health_of(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url + "/health", timeout=10)
    except httpx.TransportError:  # not listening yet
        return None


def wait_for(check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Polls `check`; the deadline only bounds a wait that would otherwise hang a failing test."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_a_starting_server_answers_503_then_serves(make_server: Callable[..., LiveServer],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's load is held until the test has seen the server answer while it starts (no race with a fast
    load): /health and requests get 503 with Retry-After, and the same server serves once it is released."""
    loading, release = threading.Event(), threading.Event()
    load = engine_module.load

    def held_load(config: EngineConfig) -> object:
        loading.set()
        release.wait(60)
        return load(config)

    monkeypatch.setattr(engine_module, "load", held_load)
    server = make_server(wait_ready=False)
    try:
        wait_for(lambda: loading.is_set() and health_of(server.url) is not None)
        health = health_of(server.url)
        assert health is not None and health.status_code == 503 and health.json()["status"] == "starting"
        assert int(health.headers["retry-after"]) >= 1
        resp = httpx.post(server.url + "/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "alloy"},
                          timeout=10)
        assert resp.status_code == 503 and resp.json()["error"]["type"] == "server_error"
        assert int(resp.headers["retry-after"]) >= 1
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert scrape(client)["talkstream_engine_ready"] == 0
    finally:
        release.set()
    wait_for(lambda: (h := health_of(server.url)) is not None and h.status_code == 200)
    resp = httpx.post(server.url + "/v1/audio/speech", timeout=60,
                      json={"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "pcm"})
    assert resp.status_code == 200 and len(resp.content) > 0


def test_metrics_count_websocket_first_audio_and_failed_requests(make_server: Callable[..., LiveServer]) -> None:
    server = make_server()
    assert server.engine.worker is not None
    with httpx.Client(base_url=server.url, timeout=60) as client:
        before = scrape(client)
        with connect(server.ws_url, max_size=None, open_timeout=30) as ws:
            ws.recv(timeout=30)
            ws.send(json.dumps({"type": "input_text_buffer.append", "text": "Count my first audio."}))
            ws.send(json.dumps({"type": "input_text_buffer.commit"}))
            while json.loads(ws.recv(timeout=30))["type"] != "response.done":
                pass

        def fail(stage: str, batch: object) -> None:
            raise RuntimeError("injected")

        server.engine.worker.fault_hook = fail
        try:
            failed = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Fail.", "voice": "alloy"})
        finally:
            server.engine.worker.fault_hook = None
        assert failed.status_code == 500
        after = scrape(client)

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert grew("talkstream_time_to_first_audio_seconds_count{protocol=ws}") == 1
    assert grew("talkstream_requests_total{outcome=eos,protocol=ws}") == 1
    assert grew("talkstream_requests_total{outcome=error,protocol=http}") == 1
    assert grew("talkstream_errors_total{code=generation_error,type=server_error}") == 1
    assert grew("talkstream_time_to_first_audio_seconds_count{protocol=http}") == 0  # it never had audio


def test_engine_ready_reads_0_once_the_engine_is_dead(make_server: Callable[..., LiveServer]) -> None:
    server = make_server()
    loaded = server.engine._loaded
    assert loaded is not None and loaded.codec_process is not None
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert scrape(client)["talkstream_engine_ready"] == 1
        os.kill(loaded.codec_process.pid, signal.SIGKILL)  # the engine cannot go on without its codec
        wait_for(lambda: client.get("/health").json()["status"] == "dead")
        assert scrape(client)["talkstream_engine_ready"] == 0

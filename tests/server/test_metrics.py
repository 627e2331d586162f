"""Listings, health, OpenAPI docs and Prometheus metrics; a disconnect mid-stream frees its slot."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server.app import create_app
from server.state import state_of
from talker.config import EngineConfig
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

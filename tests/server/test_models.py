"""Several checkpoints in one server: each its own engine, a request's `model` picks one, OpenAI's model names mean
the first; each model speaks as it does alone, and a busy model does not starve the other."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from engine.config import EngineConfig
from server.state import state_of
from tests.conftest import OFFICIAL_TINY
from tests.server.conftest import LiveServer, start_server

CV = Path(OFFICIAL_TINY).name
LONG_TEXT = "This sentence keeps going on and on so that the audio lasts for a good while. " * 6
GREEDY_CV = {"model": CV, "voice": "ryan", "temperature": 0.0, "repetition_penalty": 1.0, "response_format": "pcm"}


@pytest.fixture(scope="module")
def two(server_config: EngineConfig) -> Iterator[LiveServer]:
    cv = replace(server_config, model=str(OFFICIAL_TINY), max_frames=119, max_batch=4).tuned(detect_language=False)
    server = start_server([server_config, cv])  # type: ignore[arg-type]
    yield server
    server.stop()


def post(server: LiveServer, **body: object) -> httpx.Response:
    resp = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp


def test_both_models_are_listed_ready_and_have_their_own_voices(two: LiveServer) -> None:
    ids = [m["id"] for m in httpx.get(two.url + "/v1/models", timeout=10).json()["data"]]
    assert ids[:2] == ["tiny", CV] and "tts-1" in ids
    health = httpx.get(two.url + "/health", timeout=10).json()
    assert health["status"] == "ready" and health["models"] == {"tiny": "ready", CV: "ready"}
    cv_voices = httpx.get(two.url + "/v1/audio/voices", params={"model": CV}, timeout=10).json()
    assert cv_voices["model"] == CV and "ryan" in {v["id"] for v in cv_voices["data"]}
    default = httpx.get(two.url + "/v1/audio/voices", timeout=10).json()
    assert default["model"] == "tiny" and "ryan" not in {v["id"] for v in default["data"]}
    assert httpx.get(two.url + "/v1/audio/voices", params={"model": "nope"}, timeout=10).status_code == 404


def test_each_model_speaks_as_it_does_alone(two: LiveServer, live: LiveServer) -> None:
    reference = np.load(str(OFFICIAL_TINY) + ".reference.npz")["w0"]
    expected = np.clip(np.rint(reference * 32767.0), -32768, 32767)
    tiny_body = {"model": "tts-1", "voice": "alloy", "input": "Hello there, my friend.", "seed": 3,
                 "temperature": 0.0, "response_format": "pcm"}
    alone = post(live, **tiny_body).content
    for _ in range(2):  # interleaved: one model, then the other
        cv = np.frombuffer(post(two, input="hello world this is a tiny test", **GREEDY_CV).content, "<i2")
        assert cv.size == expected.size and np.abs(cv.astype(np.int64) - expected).max() <= 2
        assert post(two, **tiny_body).content == alone


def test_a_busy_model_does_not_starve_the_other(two: LiveServer) -> None:
    """Eight long streams keep the first model's engine busy; a request to the second completes meanwhile, and the
    first keeps stepping while it runs (steps counted, not timed). The streams are read at most 100 ms of audio per
    50 ms, so that they outlast that request however slowly a loaded machine runs it: read faster, they ended first
    there (the engine makes audio only as fast as it is read, so the first model steps on while they are read)."""
    streaming, stop = threading.Barrier(9), threading.Event()
    read: list[int] = []

    def long_stream(i: int) -> None:
        body = {"model": "tiny", "voice": "alloy", "input": LONG_TEXT * 6, "seed": i, "response_format": "pcm"}
        with httpx.stream("POST", two.url + "/v1/audio/speech", json=body, timeout=120) as resp:
            chunks = resp.iter_bytes(4800)  # 100 ms of 24 kHz PCM
            total = len(next(chunks))
            streaming.wait(60)
            for chunk in chunks:  # until the test has seen what it needs; closing the stream cancels the rest
                total += len(chunk)
                if stop.wait(0.05):
                    break
            read.append(total)

    threads = [threading.Thread(target=long_stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    streaming.wait(60)
    tiny = state_of(two.app).engines["tiny"]
    steps = len(tiny.worker.timings.snapshot()) if tiny.worker else 0
    # requests in flight, not slots: a long text's request is out of its slot for a moment between segments
    busy = tiny.active_requests()
    post(two, input="the quick brown fox jumps over the lazy dog", **GREEDY_CV)
    still = tiny.active_requests()
    stepped = (len(tiny.worker.timings.snapshot()) if tiny.worker else 0) - steps
    stop.set()
    for t in threads:
        t.join(120)
    assert busy == still == 8  # the second model finished while all eight streams of the first were running
    assert stepped > 0 and len(read) == 8


def test_a_realtime_session_picks_its_model(two: LiveServer) -> None:
    with connect(two.ws_url, max_size=None, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["session"]["model"] == "tiny"
        ws.send(json.dumps({"type": "session.update", "session": {"model": CV, "voice": "ryan"}}))
        updated = json.loads(ws.recv(timeout=30))
        assert updated["type"] == "session.updated" and updated["session"]["model"] == CV
        ws.send(json.dumps({"type": "session.update", "session": {"model": "nope"}}))
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error" and error["error"]["code"] == "model_not_found"

"""What a `talkstream serve` process sends is the official package's audio.

The CustomVoice checkpoint the official `qwen-tts` package wrote, served from tests/fixtures/official, in both output
modes, with the native kernels on and off; greedy requests over HTTP (`pcm`, `wav`, SSE) and the Realtime WebSocket;
compared sample by sample with that package's own greedy waveforms (`generate_custom_voice`, speaker `ryan`,
repetition penalty 1, 119 frames: neither text reaches EOS). A wrong sound anywhere on the path fails here: the
model, the sampler, the worker, the codec process, the int16 conversion, the transcoder, the routes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from tests.conftest import OFFICIAL_TINY
from tests.server.test_process import Served

# within 2 LSB of a reference made on another machine: the arithmetic that every CPU's kernels must agree on
pytestmark = pytest.mark.bitexact

TEXTS = {"w0": "hello world this is a tiny test", "w1": "the quick brown fox jumps over the lazy dog"}
FRAMES = 119  # the references' length: max_new_tokens=120 and no EOS
LSB = 2  # int16 steps: the references are float32, the server rounds once
GREEDY = {"voice": "ryan", "temperature": 0.0, "repetition_penalty": 1.0}


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    data = np.load(str(OFFICIAL_TINY) + ".reference.npz")
    return {k: np.clip(np.rint(data[k] * 32767.0), -32768, 32767) for k in TEXTS}


@pytest.fixture(scope="module", params=[("async", "1"), ("sync", "0"), ("async", "0")],
                ids=["async-native", "sync-torch", "async-torch"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    mode, native = request.param
    # the official outputs were made with the language unset: it goes to the model unnamed, not detected
    env = {"TALKSTREAM_MAX_FRAMES": str(FRAMES), "TALKSTREAM_TUNING": f"native_kernels={native},detect_language=0"}
    served = Served(tmp_path_factory.mktemp("cache"), "--model", str(OFFICIAL_TINY), "--output-mode", mode, env=env)
    yield served
    served.proc.terminate()
    served.proc.wait(30)


def assert_official(pcm: bytes, expected: np.ndarray) -> None:
    got = np.frombuffer(pcm, dtype="<i2").astype(np.int64)
    assert got.size == expected.size == FRAMES * 1920
    worst = int(np.abs(got - expected).max())
    assert worst <= LSB, f"served audio differs from the official package's by up to {worst} LSB"


def speech(server: Served, text: str, **fields: object) -> httpx.Response:
    body = {"model": Path(OFFICIAL_TINY).name, "input": text, **GREEDY, **fields}
    resp = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp


@pytest.mark.parametrize("key", sorted(TEXTS))
def test_http_pcm_and_wav(server: Served, reference: dict[str, np.ndarray], key: str) -> None:
    assert_official(speech(server, TEXTS[key], response_format="pcm").content, reference[key])
    wav = speech(server, TEXTS[key], response_format="wav").content
    assert wav[:4] == b"RIFF"
    assert_official(wav[44:], reference[key])


def test_sse_says_the_frame_cap_cut_it(server: Served, reference: dict[str, np.ndarray]) -> None:
    resp = speech(server, TEXTS["w1"], response_format="pcm", stream_format="sse")
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    assert_official(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), reference["w1"])
    assert events[-1]["status"] == "incomplete" and events[-1]["usage"]["output_tokens"] == FRAMES


def test_realtime(server: Served, reference: dict[str, np.ndarray]) -> None:
    with connect(server.url.replace("http", "ws") + "/v1/realtime", max_size=None, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": GREEDY}))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"
        for key in sorted(TEXTS):
            ws.send(json.dumps({"type": "input_text_buffer.append", "text": TEXTS[key]}))
            ws.send(json.dumps({"type": "input_text_buffer.commit"}))
            pcm = b""
            while (event := json.loads(ws.recv(timeout=60)))["type"] != "response.done":
                if event["type"] == "response.output_audio.delta":
                    pcm += base64.b64decode(event["delta"])
            assert event["response"]["status"] == "incomplete"
            assert_official(pcm, reference[key])

"""Clients' audio is decoded in decoder processes: a lying header is a quick 400 from a live server, a decode held in
its process leaves the server answering, a full queue is a 429, a decode past its time budget is killed and its
process replaced, the processes are light (no torch; a memory ceiling) and decode exactly as this process does,
and they end with the server, however it ends."""

from __future__ import annotations

import asyncio
import io
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest

from server.audio import decoder as audio_decoder
from server.audio import input as audio_input
from server.audio.decoder import MEMORY_BUDGET, TIME_BUDGET_S, DecoderPool
from tests.conftest import FIXTURES
from tests.server.audio.test_audio_input import encode, lying_wav, tone
from tests.server.conftest import LiveServer
from tests.server.test_process import Served, alive, wait_for

REF = (FIXTURES / "voice-ref-a.wav").read_bytes()
WAIT_S = 60.0  # for conditions that come at once on an idle machine


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[DecoderPool]:
    """A pool of one decoder in place of the server's, so the test knows which process has the file."""
    ours = DecoderPool(workers=1, queue_size=1, time_budget_s=600.0)
    monkeypatch.setattr(audio_decoder, "POOL", ours)
    yield ours
    ours.close()


@pytest.fixture(scope="module")
def slow_flac() -> bytes:
    """Real audio at the limits that takes long to decode: 30 s at 384 kHz in 8 channels (constant, so 20 KB)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="flac") as container:
        stream = container.add_stream("flac", rate=384000, layout="7.1")
        block = np.full((1, 384000 * 8), 8000, np.int16)
        for second in range(30):
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout="7.1")
            frame.rate, frame.pts = 384000, second * 384000
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def upload(url: str, audio: bytes) -> httpx.Response:
    """A consent recording (the cheapest route that decodes); a stored one is deleted again."""
    resp = httpx.post(url + "/v1/audio/voice_consents", data={"name": "me", "language": "en-US"},
                      files={"recording": ("a.wav", audio)}, timeout=WAIT_S)
    if resp.status_code == 200:
        httpx.delete(f"{url}/v1/audio/voice_consents/{resp.json()['id']}", timeout=WAIT_S).raise_for_status()
    return resp


def assert_refused(resp: httpx.Response, status: int, code: str, param: str | None = "recording") -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    return error


@pytest.mark.parametrize(("rate", "channels"), [(380_000_007, 1), (50_000_017, 1), (24000, 64)])
def test_lying_headers_are_a_400_from_a_live_server(live: LiveServer, rate: int, channels: int) -> None:
    error = assert_refused(upload(live.url, lying_wav(rate, channels)), 400, "unsupported_audio")
    assert error["message"].startswith("recording: ") and ("Hz" in error["message"] or "channels" in error["message"])
    assert httpx.get(live.url + "/health", timeout=WAIT_S).status_code == 200


def test_health_answers_while_a_decode_is_held_in_its_process(live: LiveServer, pool: DecoderPool) -> None:
    """The decoder is stopped (SIGSTOP) with a file in it: the server answers /health meanwhile, and the upload
    answers once the decoder goes on. Before, a decode held the server's GIL: nothing else ran."""
    assert upload(live.url, REF).status_code == 200
    [pid] = pool.pids()
    with ThreadPoolExecutor(1) as threads:
        os.kill(pid, signal.SIGSTOP)
        try:
            held = threads.submit(upload, live.url, REF)
            wait_for(lambda: pool.decoding == 1, WAIT_S)
            assert httpx.get(live.url + "/health", timeout=WAIT_S).status_code == 200
            assert not held.done()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert held.result().status_code == 200


def test_a_full_queue_is_a_429_with_retry_after(live: LiveServer, pool: DecoderPool) -> None:
    assert upload(live.url, REF).status_code == 200
    [pid] = pool.pids()
    with ThreadPoolExecutor(2) as threads:
        os.kill(pid, signal.SIGSTOP)
        try:
            decoding = threads.submit(upload, live.url, REF)
            wait_for(lambda: pool.decoding == 1, WAIT_S)
            waiting = threads.submit(upload, live.url, REF)
            wait_for(lambda: pool.waiting == 1, WAIT_S)
            busy = upload(live.url, REF)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert_refused(busy, 429, "server_busy", None)
        assert int(busy.headers["Retry-After"]) >= 1 and busy.json()["error"]["type"] == "rate_limit_error"
        assert decoding.result().status_code == waiting.result().status_code == 200


def test_a_decode_past_its_time_budget_is_killed_and_the_next_one_works(live: LiveServer, pool: DecoderPool,
                                                                        slow_flac: bytes) -> None:
    assert upload(live.url, REF).status_code == 200
    [pid] = pool.pids()
    pool.time_budget_s = 0.01  # the file takes 100 times that at least
    error = assert_refused(upload(live.url, slow_flac), 400, "audio_too_complex")
    assert "longer than 0.01 s" in error["message"]
    assert not alive(pid)  # killed before the client was answered
    pool.time_budget_s = TIME_BUDGET_S
    assert upload(live.url, slow_flac).status_code == 200  # the same file within the budget
    [replacement] = pool.pids()
    assert replacement != pid


def test_a_decoder_process_decodes_as_this_process_does(pool: DecoderPool, slow_flac: bytes) -> None:
    files = [REF, slow_flac, *(encode(tone(29.0, rate), rate, fmt, codec) for fmt, codec, rate in
                               (("mp3", "libmp3lame", 44100), ("flac", "flac", 44100), ("webm", "libopus", 48000)))]

    async def decoded() -> list[np.ndarray]:
        return [await audio_input.decode_async(data, "audio_sample") for data in files]

    for remote, data in zip(asyncio.run(decoded()), files, strict=True):
        np.testing.assert_array_equal(remote, audio_input.decode(data, "audio_sample"))


def test_a_decoder_process_is_light_and_has_a_memory_ceiling(pool: DecoderPool) -> None:
    asyncio.run(audio_input.decode_async(REF, "ref_audio"))
    [pid] = pool.pids()
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libavcodec" in maps and "torch" not in maps
    [data] = [line.split() for line in Path(f"/proc/{pid}/limits").read_text().splitlines()
              if line.startswith("Max data size")]
    assert data[3:5] == [str(MEMORY_BUDGET)] * 2


def test_the_decoders_stop_with_the_server(make_server: Any, pool: DecoderPool) -> None:
    server = make_server()
    assert upload(server.url, REF).status_code == 200
    [pid] = pool.pids()
    server.stop()
    assert not alive(pid) and pool.pids() == []


def test_a_decoder_dies_with_a_killed_server(tiny_cache: Path, tiny_dir: Path, tmp_path: Path) -> None:
    server = Served(tiny_cache, "--data-dir", str(tmp_path))
    try:
        assert upload(server.url, REF).status_code == 200
        pids = [p for p in server.children()
                if b"server.audio.decoder_process" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert pids
        server.proc.kill()
        server.proc.wait(WAIT_S)
        wait_for(lambda: not any(alive(p) for p in pids), WAIT_S)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(WAIT_S)

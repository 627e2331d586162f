"""`POST /v1/audio/speech` against a live server: the official SDK, raw HTTP streaming, SSE, speed, rates."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from openai import OpenAI

from tests.server.conftest import LiveServer
from tests.server.leaks import scrape
from tests.server.pcm import PCM_RATE, decode, parse_wav_header, seconds

TEXT = "Hello from the streaming speech server, this is a test."
LONG_TEXT = "This sentence keeps going on and on so that the audio lasts for a good while. " * 12
FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
RATES = {"opus": 48000}
SEEDED = {"seed": 7, "temperature": 0.0}


def body(**fields: object) -> dict[str, object]:
    return {"model": "tts-1", "input": TEXT, "voice": "alloy", **SEEDED, **fields}


@pytest.fixture(scope="module")
def sdk(live: LiveServer) -> Iterator[OpenAI]:
    with OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as client:  # closes its sockets
        yield client


@pytest.fixture(scope="module")
def reference_seconds(live: LiveServer) -> float:
    """Duration of TEXT with the seeded greedy settings, from raw PCM."""
    resp = httpx.post(live.url + "/v1/audio/speech", json=body(response_format="pcm"), timeout=60)
    assert resp.status_code == 200
    return len(resp.content) / 2 / PCM_RATE


@pytest.mark.parametrize("fmt", FORMATS)
def test_sdk_create_every_format(sdk: OpenAI, fmt: str, reference_seconds: float) -> None:
    resp = sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt,  # type: ignore[arg-type]
                                   extra_body=SEEDED)
    samples, rate, channels = decode(resp.content, fmt)
    assert rate == RATES.get(fmt, PCM_RATE)
    assert channels == 1
    assert samples.size / rate == pytest.approx(reference_seconds, abs=0.1)
    assert reference_seconds > 0.5


@pytest.mark.parametrize("fmt", ["mp3", "wav", "opus"])
def test_sdk_streaming_response(sdk: OpenAI, fmt: str, reference_seconds: float) -> None:
    with sdk.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice={"id": "ben"}, input=TEXT, response_format=fmt,  # type: ignore[arg-type]
        extra_body=SEEDED,
    ) as resp:
        assert resp.headers["content-type"].startswith({"mp3": "audio/mpeg", "wav": "audio/wav",
                                                        "opus": "audio/ogg"}[fmt])
        data = b"".join(resp.iter_bytes())
    assert seconds(data, fmt) == pytest.approx(reference_seconds, abs=0.1)


def test_default_format_is_mp3_and_model_id_works(live: LiveServer) -> None:
    resp = httpx.post(live.url + "/v1/audio/speech", json={"model": live.engine.model_id, "input": "Hi there.",
                                                           "voice": "aria"}, timeout=60)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "audio/mpeg"
    assert seconds(resp.content, "mp3") > 0.1


HELD_AT_STEP = 4  # frames 1-3 are made: the first chunks (1 frame, then 2) are out


def test_raw_stream_is_chunked_and_audio_comes_before_the_generation_ends(live: LiveServer) -> None:
    """Streaming shown by events: the Talker is held at the request's 4th step until the client has read audio, so
    a server that sent nothing before its generation ended would never send anything (the hold's time-out, a
    failure bound only, would end it and fail the test)."""
    assert live.engine.worker is not None and live.wait_idle()["slots_in_use"] == 0  # its steps are this request's
    steps, held, read, timed_out = 0, threading.Event(), threading.Event(), threading.Event()

    def hold(stage: str, batch: object) -> None:  # the worker's test hook, on its thread
        nonlocal steps
        if stage != "step":
            return
        steps += 1
        if steps == HELD_AT_STEP:
            held.set()
            if not read.wait(30):
                timed_out.set()

    live.engine.worker.fault_hook = hold
    try:
        with httpx.Client(base_url=live.url, timeout=60) as client, client.stream(
            "POST", "/v1/audio/speech", json=body(input=LONG_TEXT[:400], response_format="wav")
        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["transfer-encoding"] == "chunked"
            data = resp.iter_raw()
            chunks = [next(data)]
            assert steps <= HELD_AT_STEP and not timed_out.is_set()  # read while the generation cannot go on
            read.set()
            chunks += list(data)
    finally:
        read.set()
        live.engine.worker.fault_hook = None
    assert held.is_set() and not timed_out.is_set() and steps > HELD_AT_STEP
    wav = b"".join(chunks)
    assert len(chunks) > 3
    assert parse_wav_header(wav[:44]) == (PCM_RATE, 1)
    assert (len(wav) - 44) % 2 == 0


def test_pcm_length_matches_wav_and_sse_usage(live: LiveServer) -> None:
    pcm = httpx.post(live.url + "/v1/audio/speech", json=body(response_format="pcm"), timeout=60)
    wav = httpx.post(live.url + "/v1/audio/speech", json=body(response_format="wav"), timeout=60)
    assert pcm.headers["content-type"] == "audio/pcm"
    assert len(wav.content) - 44 == len(pcm.content)
    events = sse_events(live, body(response_format="pcm", stream_format="sse"))
    deltas = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert deltas == pcm.content
    assert len(pcm.content) == 2 * events[-1]["usage"]["samples"]


def sse_events(live: LiveServer, payload: dict[str, object]) -> list[dict[str, object]]:
    events = []
    with httpx.stream("POST", live.url + "/v1/audio/speech", json=payload, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
            else:
                assert line == ""
    return events


def test_sse_stream(live: LiveServer) -> None:
    events = sse_events(live, body(response_format="mp3", stream_format="sse"))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"} and len(kinds) > 2
    mp3 = b"".join(base64.b64decode(str(e["audio"])) for e in events[:-1])
    usage = events[-1]["usage"]
    assert isinstance(usage, dict) and usage["output_tokens"] > 0
    assert seconds(mp3, "mp3") == pytest.approx(usage["audio_seconds"], abs=0.1)


@pytest.mark.parametrize("speed", [0.5, 2.0, 4.0])
def test_speed_changes_duration(live: LiveServer, speed: float, reference_seconds: float) -> None:
    resp = httpx.post(live.url + "/v1/audio/speech", json=body(response_format="pcm", speed=speed), timeout=60)
    assert resp.status_code == 200
    assert len(resp.content) / 2 / PCM_RATE == pytest.approx(reference_seconds / speed, rel=0.1, abs=0.05)


@pytest.mark.parametrize(("fmt", "rate"), [("wav", 16000), ("mp3", 44100), ("flac", 48000), ("opus", 48000)])
def test_sample_rate_extension(live: LiveServer, fmt: str, rate: int, reference_seconds: float) -> None:
    resp = httpx.post(live.url + "/v1/audio/speech", json=body(response_format=fmt, sample_rate=rate), timeout=60)
    assert resp.status_code == 200
    samples, got_rate, _ = decode(resp.content, fmt)
    assert got_rate == rate
    assert samples.size / rate == pytest.approx(reference_seconds, abs=0.1)


def test_instructions_reach_the_model(live: LiveServer) -> None:
    """They enter the model's prompt: its input tokens grow by the instruction's (the tiny model's random weights
    barely attend to them, so its audio cannot show it; tests/talker/test_oracle_parity.py checks their effect)."""
    def usage(**fields: object) -> dict[str, int]:
        done = sse_events(live, body(response_format="pcm", stream_format="sse", **fields))[-1]
        return done["usage"]  # type: ignore[return-value]

    plain, calm = usage(), usage(instructions="Speak calmly.")
    tok = live.engine._loaded.frontend.tokenizer  # type: ignore[union-attr]
    assert calm["input_tokens"] - plain["input_tokens"] == len(tok.instruct("Speak calmly.")) > 0


def test_seed_is_reproducible(live: LiveServer) -> None:
    payload = body(response_format="pcm", temperature=0.9, top_k=20, top_p=0.9, seed=1234)
    a = httpx.post(live.url + "/v1/audio/speech", json=payload, timeout=60)
    b = httpx.post(live.url + "/v1/audio/speech", json=payload, timeout=60)
    assert a.status_code == b.status_code == 200
    assert a.content == b.content


async def test_32_concurrent_streams_complete(live: LiveServer) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> int:
        fmt = FORMATS[i % len(FORMATS)]
        async with client.stream("POST", "/v1/audio/speech", json=body(seed=i, response_format=fmt)) as resp:
            assert resp.status_code == 200
            data = b"".join([chunk async for chunk in resp.aiter_bytes()])
        assert seconds(data, fmt) > 0.5
        return len(data)

    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=live.url, timeout=120, limits=limits) as client:
        sizes = await asyncio.gather(*(one(client, i) for i in range(32)))
    assert all(sizes)
    stats = await asyncio.to_thread(live.wait_idle)
    assert stats["active_requests"] == stats["slots_in_use"] == 0


def test_sse_usage_has_openais_token_counts_and_counts_what_was_sent(live: LiveServer) -> None:
    payload = body(response_format="pcm", stream_format="sse", speed=0.5, sample_rate=16000)
    events = sse_events(live, payload)
    sent = b"".join(base64.b64decode(str(e["audio"])) for e in events if e["type"] == "speech.audio.delta")
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["status"] == "completed" and "status_details" not in done
    usage = done["usage"]
    assert isinstance(usage, dict)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] and usage["input_tokens"] > 0
    assert usage["samples"] == len(sent) // 2  # after speed and resampling, not the model's 24 kHz samples
    assert usage["audio_seconds"] == pytest.approx(usage["samples"] / 16000, abs=1e-4)


def test_a_long_input_is_spoken_in_full(make_server: Callable[..., LiveServer]) -> None:
    """A server whose generations hold 48 frames speaks a 900-character text to its end, in one stream."""
    server = make_server(max_frames=48)
    text = LONG_TEXT[:900]
    events = sse_events(server, body(input=text, response_format="pcm", stream_format="sse"))
    done = events[-1]
    assert done["status"] == "completed"
    usage = done["usage"]
    assert isinstance(usage, dict) and usage["output_tokens"] > 48 * 5
    assert usage["output_tokens"] >= usage["input_tokens"]  # the tiny model reads one text token per frame


def test_a_response_cut_by_a_limit_says_so_in_its_done_event(make_server: Callable[..., LiveServer]) -> None:
    """Generations of one frame: every segment is cut before its end, and the done event says `incomplete`."""
    server = make_server(max_frames=1)
    events = sse_events(server, body(input="Hello there.", response_format="pcm", stream_format="sse"))
    assert events[-1]["status"] == "incomplete"
    assert events[-1]["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}


def test_a_plain_stream_cut_by_a_limit_ends_normally_and_is_counted(make_server: Callable[..., LiveServer]) -> None:
    """A plain audio stream has no place for a status: one a limit cut ends like a complete one (whole frames, the
    chunked transfer's last chunk: httpx would raise on a truncated one) and the metrics count it."""
    server = make_server(max_frames=1)
    counted = 'talkstream_requests_total{outcome="max_frames",protocol="http"}'
    before = scrape(server.url).get(counted, 0)
    resp = httpx.post(server.url + "/v1/audio/speech", json=body(input="Hello there.", response_format="pcm"),
                      timeout=60)
    assert resp.status_code == 200 and len(resp.content) > 0 and len(resp.content) % (2 * 1920) == 0
    assert scrape(server.url)[counted] == before + 1


def test_a_plain_get_of_the_realtime_endpoint_is_426(live: LiveServer) -> None:
    resp = httpx.get(live.url + "/v1/realtime", timeout=10)
    assert resp.status_code == 426 and resp.headers["upgrade"] == "websocket"
    assert resp.json()["error"]["code"] == "upgrade_required"

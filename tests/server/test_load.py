"""Load shapes: a disconnect storm, overload past the queue, slow and stalled readers over real HTTP. Checked by
events and counts (who was answered, who took Talker steps), never by how fast: timings belong in benchmarks."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import socket
import threading
import time
from collections.abc import Callable

import httpx

from talker.scheduler import Seq, SeqStatus
from tests.server.conftest import LiveServer
from tests.server.leaks import wait_no_leaks
from tests.server.rawclient import raw_request as stalled_request
from tests.server.test_abort_paths import raw_request, speech

PCM_BYTES_PER_S = 48000


def wait_for(check: Callable[[], bool], timeout: float = 15.0) -> None:
    """Polls `check`; the deadline only bounds a wait that would otherwise hang a failing test."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


async def test_disconnect_storm_then_normal_service(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(max_batch=16, max_queue=16)

    async def request(client: httpx.AsyncClient) -> str:
        async with client.stream("POST", "/v1/audio/speech", json=speech()) as resp:
            if resp.status_code == 429:
                assert int(resp.headers["retry-after"]) >= 1
                return "busy"
            assert resp.status_code == 200
            async for _ in resp.aiter_raw():
                pass
        return "done"

    async def impatient(client: httpx.AsyncClient) -> str:
        try:
            return await asyncio.wait_for(request(client), 0.5)
        except (TimeoutError, httpx.TimeoutException):
            return "timeout"

    limits = httpx.Limits(max_connections=256)
    async with httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(5.0), limits=limits) as c:
        outcomes = await asyncio.gather(*(impatient(c) for _ in range(200)))
    assert set(outcomes) <= {"busy", "timeout", "done"}, outcomes
    # the departed clients' requests are all reclaimed (a disconnect is seen within 0.25 s; 15 s bounds the wait)
    assert not (counts := await asyncio.to_thread(wait_no_leaks, server.url, 15.0)), counts
    after = await asyncio.to_thread(httpx.post, server.url + "/v1/audio/speech", json=speech(input="After."),
                                    timeout=30)
    assert after.status_code == 200 and len(after.content) > 0
    assert not (counts := await asyncio.to_thread(wait_no_leaks, server.url)), counts
    assert httpx.get(server.url + "/health").status_code == 200


def small_send_buffers(server: LiveServer) -> None:
    """Accepted sockets inherit it: a response to a client that reads nothing really blocks in the server."""
    for listener in server.server.servers:
        for sock in listener.sockets:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)


async def test_overload_answers_429_without_waiting_for_capacity(make_server: Callable[..., LiveServer]) -> None:
    """The four places (2 slots, 2 queue) are held by clients that read nothing until every other request has
    been answered: each of those answers came while no place could free up, so none waited for one."""
    server = make_server(max_batch=2, max_queue=2, max_ahead_s=1.0)
    small_send_buffers(server)
    holders = [stalled_request(server.url, speech(seed=i)) for i in range(4)]
    try:
        await asyncio.to_thread(wait_for, lambda: server.stats()["active_requests"] == 4)

        async def one(client: httpx.AsyncClient) -> int:
            resp = await client.post("/v1/audio/speech", json=speech())
            if resp.status_code == 429:
                assert int(resp.headers["retry-after"]) >= 1 and resp.json()["error"]["type"] == "rate_limit_error"
            return resp.status_code

        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=httpx.Limits(max_connections=32)) as c:
            statuses = await asyncio.gather(*(one(c) for _ in range(20)))
        assert statuses == [429] * 20
        assert server.stats()["active_requests"] == 4  # the places were held throughout
    finally:
        for sock in holders:
            sock.close()
    assert not (counts := await asyncio.to_thread(wait_no_leaks, server.url)), counts
    assert httpx.get(server.url + "/health").status_code == 200


def stalled_reader(url: str, seed: int) -> socket.socket:
    """Reads nothing at all (a tiny receive buffer fills at once)."""
    return raw_request(url, speech(seed=seed), rcvbuf=4096)


def slow_reader(url: str, stop: threading.Event, got: list[int]) -> None:
    """Reads PCM at about half real time until told to stop. Its small segments and buffer make the server send
    to it steadily (a chunk every second or so), not in 64 KiB bursts seconds apart (loopback's MSS) that a
    reader timeout could take for a stall."""
    sock = stalled_request(url, speech())
    try:
        while not stop.is_set():
            got.append(len(sock.recv(PCM_BYTES_PER_S // 20)))
            stop.wait(0.1)
    finally:
        sock.close()


def peers(server: LiveServer) -> list[tuple[str, int]]:
    """Client addresses of the server's open connections."""
    return [tuple(p.client) for p in list(server.server.server_state.connections)]  # type: ignore[attr-defined]


def completed(url: str) -> bool:
    """A short request, served in full: its SSE stream ends `completed` with every sample it counted."""
    with httpx.stream("POST", url + "/v1/audio/speech", timeout=30,
                      json=speech(input="Quick one.", stream_format="sse")) as resp:
        assert resp.status_code == 200
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    return events[-1]["status"] == "completed" and len(pcm) == 2 * events[-1]["usage"]["samples"] > 0


STALLED_SEED = 4242  # tells the stalled reader's request apart in the scheduler


def test_slow_and_stalled_readers_do_not_hurt_others(make_server: Callable[..., LiveServer]) -> None:
    """By events, not latency: while a stalled reader holds a slot it takes no Talker step (its request is paused
    past max_ahead_s), others are served in full, and it is dropped after the reader timeout."""
    server = make_server(max_ahead_s=1.0, reader_timeout_s=5.0)
    small_send_buffers(server)  # the 45 s of audio cannot all sit in kernel buffers
    worker = server.engine.worker
    assert worker is not None
    stalled = stalled_reader(server.url, STALLED_SEED)
    stop, got = threading.Event(), []
    slow = threading.Thread(target=slow_reader, args=(server.url, stop, got))
    slow.start()
    stepped: list[set[int]] = []  # each step's seeds

    def record(stage: str, batch: tuple[Seq, ...]) -> None:
        if stage == "step":
            stepped.append({seq.seed for seq in batch})

    def stalled_seq() -> list[Seq]:
        return [seq for seq in worker.scheduler.all_seqs() if seq.seed == STALLED_SEED]

    try:
        wait_for(lambda: any(seq.status is SeqStatus.PAUSED for seq in stalled_seq()))  # it has filled its buffer
        wait_for(lambda: server.stats()["active_requests"] == 2)
        worker.fault_hook = record
        assert all(completed(server.url) for _ in range(3))
        worker.fault_hook = None
        assert stepped and not any(STALLED_SEED in seeds for seeds in stepped)  # it cost the others nothing
        for out in server.engine.live.outputs():  # bounded: paused just past max_ahead_s
            assert out.stream.buffered_seconds < 2.0
        wait_for(lambda: not stalled_seq())  # the stalled one is dropped (reader_timeout_s) ...
        wait_for(lambda: stalled.getsockname() not in peers(server))  # ... and its connection closed
        assert server.stats()["active_requests"] == 1  # only the slow reader is left
        assert sum(got) > 0
    finally:
        worker.fault_hook = None
        stop.set()
        slow.join()
        stalled.close()
    assert not (counts := wait_no_leaks(server.url)), counts


def test_the_ready_server_leaves_its_heap_out_of_collections(live: LiveServer) -> None:
    assert httpx.get(live.url + "/health").status_code == 200
    assert gc.get_freeze_count() > 100_000  # the model and libraries: a full collection would rescan all of them

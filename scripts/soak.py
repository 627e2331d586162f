"""Soak: a bounded mixed load against a `talkstream serve` subprocess for a set time.

Each of `--concurrency` clients loops over a weighted mix: HTTP speech (pcm, mp3), Realtime responses, HTTP and
Realtime cancels, bad HTTP requests and bad Realtime events. Every minute it prints one JSON line (requests
completed, failures by cause, p99 time to first audio, RSS of the server and its codec child); the last line is
the summary. The run fails (exit 1) if anything was lost, i.e. a request that should have completed did not.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

TEXTS = ["Hello there, this is a soak test.", "The quick brown fox jumps over the lazy dog.",
         "Streaming speech keeps going while the server is under load for a long while."]
EXPECTED = ("completed", "cancelled", "bad_input_400", "bad_event_error", "http_429")  # anything else is a loss
MIX = {"http_pcm": 30, "http_mp3": 20, "ws": 20, "http_cancel": 10, "ws_cancel": 5, "bad_http": 10, "bad_ws": 5}


class Tally:
    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.ttfa: list[float] = []

    def reset(self) -> tuple[Counter[str], list[float]]:
        out, self.outcomes, ttfa, self.ttfa = self.outcomes, Counter(), self.ttfa, []
        return out, ttfa


def body(i: int, fmt: str) -> dict[str, object]:
    return {"model": "tts-1", "input": TEXTS[i % len(TEXTS)], "voice": "alloy", "response_format": fmt}


async def http_speech(c: httpx.AsyncClient, t: Tally, i: int, fmt: str, cancel: bool) -> None:
    t0 = time.perf_counter()
    async with c.stream("POST", "/v1/audio/speech", json=body(i, fmt)) as resp:
        if resp.status_code != 200:
            t.outcomes[f"http_{resp.status_code}"] += 1
            return
        n = 0
        async for data in resp.aiter_raw():
            if n == 0:
                t.ttfa.append(time.perf_counter() - t0)
            n += len(data)
            if cancel:
                t.outcomes["cancelled"] += 1
                return
    t.outcomes["completed" if n else "empty_audio"] += 1


async def bad_http(c: httpx.AsyncClient, t: Tally, i: int) -> None:
    payloads: list[object] = [{"model": "tts-1"}, {**body(i, "pcm"), "speed": 9}, [1, 2], {**body(i, "ogg")},
                              {**body(i, "pcm"), "input": "x" * 5000}]
    resp = await c.post("/v1/audio/speech", json=payloads[i % len(payloads)])
    t.outcomes["bad_input_400" if resp.status_code == 400 else f"bad_input_{resp.status_code}"] += 1


async def ws_response(url: str, t: Tally, i: int, cancel: bool, bad: bool) -> None:
    async with connect(url.replace("http://", "ws://") + "/v1/realtime", max_size=None) as ws:
        await ws.recv()
        if bad:
            await ws.send(["{not json", b"\xff\xfe", json.dumps({"type": "nope"})][i % 3])
            event = json.loads(await ws.recv())
            t.outcomes["bad_event_error" if event["type"] == "error" else "bad_event_" + event["type"]] += 1
            return
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "input_text_buffer.append", "text": TEXTS[i % len(TEXTS)]}))
        await ws.send(json.dumps({"type": "input_text_buffer.commit"}))
        samples, first = 0, True
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "response.output_audio.delta":
                if first:
                    t.ttfa.append(time.perf_counter() - t0)
                    first = False
                    if cancel:
                        await ws.send(json.dumps({"type": "response.cancel"}))
                samples += len(base64.b64decode(event["delta"])) // 2
            elif event["type"] == "error":
                t.outcomes["ws_error_" + str(event["error"]["code"])] += 1
                return
            elif event["type"] == "response.done":
                status = event["response"]["status"]
                ok = status == "completed" and samples == event["response"]["usage"]["samples"] > 0
                t.outcomes["completed" if ok else "cancelled" if status == "cancelled" else f"ws_{status}"] += 1
                return


async def client(url: str, t: Tally, until: float, seed: int) -> None:
    rng = random.Random(seed)
    kinds, weights = list(MIX), list(MIX.values())
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        i = 0
        while time.monotonic() < until:
            kind = rng.choices(kinds, weights)[0]
            i += 1
            try:
                if kind.startswith("http_") or kind == "http_cancel":
                    fmt = "mp3" if kind == "http_mp3" else "pcm"
                    await http_speech(c, t, i, fmt, cancel=kind == "http_cancel")
                elif kind == "bad_http":
                    await bad_http(c, t, i)
                else:
                    await ws_response(url, t, i, cancel=kind == "ws_cancel", bad=kind == "bad_ws")
            except Exception as exc:
                t.outcomes[f"lost_{type(exc).__name__}"] += 1


def rss_mib(pid: int) -> float:
    """RSS of a process and its children (the codec process), MiB."""
    children = [int(p) for path in Path(f"/proc/{pid}/task").glob("*/children") for p in path.read_text().split()]
    pids = [pid, *children]
    total = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def p99(xs: list[float]) -> float | None:
    return round(sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))], 4) if xs else None


async def run(url: str, pid: int, minutes: float, concurrency: int) -> dict[str, object]:
    t = Tally()
    start = time.monotonic()
    until = start + minutes * 60
    clients = [asyncio.create_task(client(url, t, until, s)) for s in range(concurrency)]
    total: Counter[str] = Counter()
    per_minute = []
    while not all(c.done() for c in clients):
        await asyncio.wait(clients, timeout=min(60.0, max(1.0, until - time.monotonic() + 1)))
        outcomes, ttfa = t.reset()
        total += outcomes
        row = {"minute": len(per_minute) + 1, "outcomes": dict(outcomes), "p99_ttfa_s": p99(ttfa),
               "rss_mib": rss_mib(pid)}
        per_minute.append(row)
        print(json.dumps(row), flush=True)
    lost = {k: v for k, v in total.items() if k not in EXPECTED}
    metrics = httpx.get(url + "/metrics").text
    leaks = [line for line in metrics.splitlines() if line.startswith(("talkstream_active_requests ",
             "talkstream_slots_in_use ", "talkstream_codec_streams ", "talkstream_open_encoders "))]
    return {"minutes": minutes, "concurrency": concurrency, "totals": dict(total), "lost": lost,
            "rss_mib_first_last": [per_minute[0]["rss_mib"], per_minute[-1]["rss_mib"]], "gauges_after": leaks}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=8, help="clients (about half of --max-batch)")
    p.add_argument("--max-batch", type=int, default=16)
    args = p.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--max-batch",
                               str(args.max_batch), "--log-level", "warning"], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        summary = asyncio.run(run(url, server.pid, args.minutes, args.concurrency))
        print(json.dumps(summary), flush=True)
        return 1 if summary["lost"] else 0
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    raise SystemExit(main())

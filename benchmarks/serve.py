"""`talkstream bench serve`: load a running server over HTTP and WebSocket at several concurrencies.

For each protocol and concurrency it runs `--requests` requests (at least one per stream) from that many concurrent
clients, each sending its next request when its last one ends. The streams start `--stagger-ms` apart, as users
arrive; with 0 they start at once and, asking for the same text, stay in step: every request then comes in a burst
of them all. It reports time to first audio byte p50/p99, the per-stream real-time factor (generation wall time
over audio duration; below 1 is faster than real time), aggregate audio seconds per wall second (the wall time
includes the staggered start) and failures.
With --json the last printed line is the whole result as JSON. With --ray-replicas 1,2 it starts a Ray instance
on this machine and runs the same levels against Talkstream on Ray Serve with each replica count in turn
(benchmarks/serve_ray.py; the [ray] extra).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from benchmarks.http_client import Connection, HttpError, HttpStatusError

PCM_BYTES_PER_S = 24000 * 2
MIN_REQUESTS = 32  # per level: a 1-stream p50 of two requests says little
TEXT = "The quick brown fox jumps over the lazy dog while the band keeps playing softly in the background."


@dataclass
class Sample:
    ttfa_s: float
    wall_s: float
    audio_s: float

    @property
    def rtf(self) -> float:
        return self.wall_s / self.audio_s if self.audio_s > 0 else float("inf")


@dataclass
class Level:
    protocol: str
    concurrency: int
    samples: list[Sample] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0  # this load client's own CPU time: it shares the machine it measures

    def summary(self) -> dict[str, Any]:
        ttfa = [s.ttfa_s * 1e3 for s in self.samples]
        rtf = [s.rtf for s in self.samples]
        audio = sum(s.audio_s for s in self.samples)
        return {
            "protocol": self.protocol, "concurrency": self.concurrency, "requests": len(self.samples),
            "failures": len(self.failures),
            "ttfa_ms_p50": _pct(ttfa, 50), "ttfa_ms_p99": _pct(ttfa, 99),
            "rtf_p50": _pct(rtf, 50), "rtf_max": max(rtf, default=None),
            "audio_s_per_s": round(audio / self.wall_s, 3) if self.wall_s else None,
            "wall_s": round(self.wall_s, 3), "client_cpu_s": round(self.client_cpu_s, 3),
            "first_failure": self.failures[0] if self.failures else None,
        }


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="talkstream bench serve", description=__doc__)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated stream counts")
    p.add_argument("--requests", type=int, default=0,
                   help=f"requests per level (default: 2 per stream, at least {MIN_REQUESTS})")
    p.add_argument("--protocol", default="http,ws", help="http, ws or both")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--voice", default="alloy")
    p.add_argument("--api-key", default=None)
    p.add_argument("--stagger-ms", type=float, default=50.0,
                   help="stream k starts k x this after the level begins (0: all at once)")
    p.add_argument("--ray-replicas", default=None,
                   help="comma-separated replica counts: deploy each on Ray Serve here and load it (ignores --url)")
    p.add_argument("--ray-cpus", type=float, default=1.0, help="logical CPUs each Ray replica reserves")
    p.add_argument("--ray-gpus", type=float, default=0.0, help="GPUs each Ray replica gets (1: one device each)")
    p.add_argument("--json", action="store_true")
    return p


# Clients ----------------------------------------------------------------------------------------------------------
async def http_one(conn: Connection, args: argparse.Namespace) -> Sample:
    body = json.dumps({"model": "tts-1", "input": args.text, "voice": args.voice, "response_format": "pcm"})
    t0 = time.perf_counter()
    first: float | None = None
    size = 0
    async for data in conn.request("POST", "/v1/audio/speech", body.encode()):
        first = first or time.perf_counter()
        size += len(data)
    end = time.perf_counter()
    return Sample((first or end) - t0, end - t0, size / PCM_BYTES_PER_S)


async def ws_one(ws: ClientConnection, args: argparse.Namespace) -> Sample:
    await ws.send(json.dumps({"type": "input_text_buffer.append", "text": args.text}))
    t0 = time.perf_counter()
    await ws.send(json.dumps({"type": "input_text_buffer.commit"}))
    first: float | None = None
    size = 0
    while True:
        event = json.loads(await ws.recv())
        kind = event["type"]
        if kind == "response.output_audio.delta":
            first = first or time.perf_counter()
            size += len(base64.b64decode(event["delta"]))
        elif kind == "error":
            raise RuntimeError(event["error"]["message"])
        elif kind == "response.done":
            if event["response"]["status"] != "completed":
                raise RuntimeError(f"response {event['response']['status']}")
            break
    end = time.perf_counter()
    return Sample((first or end) - t0, end - t0, size / PCM_BYTES_PER_S)


# Levels ----------------------------------------------------------------------------------------------------------
async def run_level(args: argparse.Namespace, protocol: str, concurrency: int) -> Level:
    level = Level(protocol, concurrency)
    total = max(args.requests or max(2 * concurrency, MIN_REQUESTS), concurrency)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    worker = _http_worker if protocol == "http" else _ws_worker
    t0, cpu0 = time.perf_counter(), _cpu_s()
    async def stream(k: int) -> None:
        await asyncio.sleep(k * args.stagger_ms / 1e3)
        await worker(args, headers, queue, level)

    await asyncio.gather(*(stream(k) for k in range(concurrency)))
    level.wall_s, level.client_cpu_s = time.perf_counter() - t0, _cpu_s() - cpu0
    return level


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _http_worker(args: argparse.Namespace, headers: dict[str, str], queue: asyncio.Queue[int],
                       level: Level) -> None:
    try:
        async with Connection.open(args.url, headers) as conn:
            async for _ in conn.request("GET", "/health"):  # open the connection untimed, as a WebSocket client does
                pass
            await _take_all(queue, level, lambda: http_one(conn, args), HttpStatusError)
    except (OSError, HttpError) as exc:  # the connection broke: this stream stops
        level.failures.append(f"{type(exc).__name__}: {exc}")


async def _ws_worker(args: argparse.Namespace, headers: dict[str, str], queue: asyncio.Queue[int],
                     level: Level) -> None:
    url = args.url.replace("http", "ws", 1).rstrip("/") + "/v1/realtime"
    try:
        async with connect(url, additional_headers=headers, max_size=None) as ws:
            await ws.recv()  # session.created
            await ws.send(json.dumps({"type": "session.update", "session": {"voice": args.voice}}))
            await ws.recv()  # session.updated
            await _take_all(queue, level, lambda: ws_one(ws, args), RuntimeError)
    except (OSError, ValueError) as exc:
        level.failures.append(f"{type(exc).__name__}: {exc}")


async def _take_all(queue: asyncio.Queue[int], level: Level, one: Callable[[], Awaitable[Sample]],
                    recoverable: type[Exception]) -> None:
    """One stream's share of a level: requests one after another until the queue is empty."""
    while not queue.empty():
        queue.get_nowait()
        try:
            level.samples.append(await one())
        except recoverable as exc:
            level.failures.append(f"{type(exc).__name__}: {exc}")


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    protocols = [p.strip() for p in args.protocol.split(",") if p.strip()]
    for proto in protocols:
        if proto not in ("http", "ws"):
            raise ValueError(f"unknown protocol {proto!r}; use http and/or ws")
    results = []
    for proto in protocols:
        for c in levels:
            level = await run_level(args, proto, c)
            results.append(level.summary())
            report_line(results[-1])
    return {"bench": "serve", "url": args.url, "text_chars": len(args.text), "stagger_ms": args.stagger_ms,
            "levels": results}


def report_line(r: dict[str, Any]) -> None:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    print(f"{r['protocol']:>4} c={r['concurrency']:<3} n={r['requests']:<4} failures={r['failures']:<3} "
          f"ttfa p50={fmt(r['ttfa_ms_p50'])} ms p99={fmt(r['ttfa_ms_p99'])} ms  "
          f"rtf p50={fmt(r['rtf_p50'])} max={fmt(r['rtf_max'])}  audio/s={fmt(r['audio_s_per_s'])}  "
          f"client cpu={fmt(r['client_cpu_s'])} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.ray_replicas:
        from benchmarks.serve_ray import run

        out = run(args, bench)
        levels = [level for r in out["runs"] for level in r["levels"]]
    else:
        out = asyncio.run(bench(args))
        levels = out["levels"]
    if args.json:
        print(json.dumps(out))
    return 1 if sum(level["failures"] for level in levels) else 0


if __name__ == "__main__":
    raise SystemExit(main())

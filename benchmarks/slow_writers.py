"""`talkstream bench slow-writers`: ordinary requests beside streamed texts that come slower than speech.

It serves `tiny` in this process (max_batch `--slots`) and, in one run:
1. alone: `--requests` ordinary HTTP speech requests one after another, nothing else running;
2. beside slow writers: `--slots` Realtime sessions with `text_streaming`, each writing one word every
   `--word-every-s` seconds (under the text timeout, so none ends), so that each holds a response waiting for text;
   the same ordinary requests run meanwhile; then the writers commit.
Per round: each ordinary request's first audio (request sent → first PCM byte) and its whole time; for the writers,
whether every session completed with its whole text spoken. A starved writer gives its slot to queued work
(talker/parking.py), so round 2's first audio should be close to round 1's: before that, an ordinary request waited
for a writer to finish its text (forever, for a writer that keeps writing). With --json the last printed line is the
whole result as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from typing import Any

import httpx

from benchmarks.text_stream import Run, open_session, read_response, serve
from engine.config import EngineConfig

WORDS = ["one", "slow", "word", "after", "another", "keeps", "this", "response", "waiting", "for", "its", "text",
         "while", "others", "speak"]
BODY = {"model": "tiny", "input": "An ordinary request, spoken beside slow writers.", "voice": "alloy",
        "response_format": "pcm", "seed": 1}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="talkstream bench slow-writers", description=__doc__)
    p.add_argument("--slots", type=int, default=2, help="max_batch, and as many slow writers")
    p.add_argument("--requests", type=int, default=5, help="ordinary requests per round")
    p.add_argument("--word-every-s", type=float, default=2.0)
    p.add_argument("--json", action="store_true")
    return p


async def ordinary(base: str, n: int) -> list[dict[str, float]]:
    """`n` speech requests one after another: first audio and whole time, in ms."""
    out = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        for _ in range(n):
            start = time.perf_counter()
            first = None
            async with client.stream("POST", "/v1/audio/speech", json=BODY) as resp:
                resp.raise_for_status()
                async for chunk in resp.aiter_bytes():
                    if chunk and first is None:
                        first = time.perf_counter()
            end = time.perf_counter()
            assert first is not None
            out.append({"first_audio_ms": (first - start) * 1e3, "total_ms": (end - start) * 1e3})
    return out


async def writer(url: str, run: Run, word_every_s: float, stop: asyncio.Event, seed: int) -> None:
    """A session that writes a word every `word_every_s` until `stop`, then commits."""
    ws = await open_session(url, text_streaming=True, seed=seed)
    reader = asyncio.create_task(read_response(ws, run))
    k = 0
    while not stop.is_set():
        piece = WORDS[k % len(WORDS)] if k == 0 else " " + WORDS[k % len(WORDS)]
        run.pieces.append(piece)
        await ws.send(json.dumps({"type": "input_text_buffer.append", "text": piece}))
        k += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), word_every_s)
    await ws.send(json.dumps({"type": "input_text_buffer.commit"}))
    await reader
    await ws.close()


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    first = [r["first_audio_ms"] for r in runs]
    return {"first_audio_ms_p50": round(statistics.median(first), 1), "first_audio_ms_max": round(max(first), 1),
            "total_ms_p50": round(statistics.median(r["total_ms"] for r in runs), 1)}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    # the text timeout well above a word's interval: the writers' responses stay open for the whole round
    config = EngineConfig.from_env(model="tiny", max_batch=args.slots, max_queue=32,
                                   text_timeout_s=max(10.0, 3 * args.word_every_s))
    url, server, thread, _ = serve(config)
    base = url.replace("ws://", "http://").removesuffix("/v1/realtime")
    try:
        alone = summary(await ordinary(base, args.requests))
        print("alone:               ", json.dumps(alone), flush=True)
        stop = asyncio.Event()
        runs = [Run(1 / args.word_every_s, []) for _ in range(args.slots)]
        writers = [asyncio.create_task(writer(url, run, args.word_every_s, stop, seed=k))
                   for k, run in enumerate(runs)]
        while not all(run.deltas for run in runs):  # every writer has had a slot and spoken: now it waits for text
            await asyncio.sleep(0.05)
        beside = summary(await ordinary(base, args.requests))
        stop.set()
        await asyncio.gather(*writers)
        beside["writers_completed"] = sum(r.status == "completed" and not r.errors for r in runs)
        beside["writer_words"] = sum(len(r.pieces) for r in runs)
        print(f"beside {args.slots} slow writers:", json.dumps(beside), flush=True)
    finally:
        server.should_exit = True
        thread.join(30)
    ratio = round(beside["first_audio_ms_p50"] / alone["first_audio_ms_p50"], 2)
    print(f"first audio p50 beside slow writers / alone: {ratio}x", flush=True)
    return {"bench": "slow-writers", "slots": args.slots, "requests": args.requests, "alone": alone,
            "beside_slow_writers": beside, "first_audio_ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(out))
    return 0 if out["beside_slow_writers"]["writers_completed"] == args.slots else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""`talkstream bench text-stream`: a text streamed into Realtime responses a word at a time, as an LLM writes it.

It serves `tiny` in this process (uvicorn on 127.0.0.1, so that it can read the Talker's step record) and runs,
over WebSockets with `text_streaming` on:
1. one session writing a `--words`-word text at 4 words per second (faster than speech);
2. one at 1 word per second (slower than speech);
3. `--sessions` sessions at once, at 1, 2, 4 and 8 words per second in turn, started `--stagger-ms` apart;
Per session it reports first audio after the first text token settled (the moment the client sent the piece that
fixed it, found with the server's own tokenizer), and the playback of a client that starts playing at its first
audio: its stalls, and the start-up buffer that would have avoided them. Rounds 1-2 check that the audio is byte for
byte that of the whole text sent at once in the streaming layout (same seed, alone: no frame lost or repeated);
round 3 that every session got its whole audio, that the Talker stepped no row for a waiting request (its rows
against the frames made), and its step time at each batch size in steps when few and when many sessions held a slot
while they waited for text (in the same run, under the same client load). The server's frame cap is raised to 2048
(`max_len` 4096) so that the whole text sent at once is one generation, as the streamed one is.
With --json the last printed line is the whole result as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from websockets.asyncio.client import ClientConnection, connect

from common.request import EngineState
from engine.config import EngineConfig
from engine.engine import Engine
from engine.text_input import HEAD
from server.app import create_app
from server.state import state_of
from talker.snapshot import StepSnapshot

PCM_BYTES_PER_S = 24000 * 2
TEXT = ("Streaming speech should start while the text is still being written, so a voice agent can answer as soon "
         "as its language model begins to reply. Each word arrives on its own, sometimes quickly and sometimes "
         "after a pause, and the audio has to follow without a gap when the text runs ahead, and wait without a "
         "glitch when it does not. Numbers like 1024 and 3.14, names like Zoë, and punctuation all arrive in "
         "pieces too.")
SPEEDS = (1.0, 2.0, 4.0, 8.0)


@dataclass
class Run:
    rate: float  # words per second
    pieces: list[str]
    sent_at: list[float] = field(default_factory=list)
    deltas: list[tuple[float, int]] = field(default_factory=list)  # (arrival, bytes)
    errors: list[str] = field(default_factory=list)
    audio: bytes = b""
    status: str = ""
    usage: dict[str, Any] = field(default_factory=dict)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="talkstream bench text-stream", description=__doc__)
    p.add_argument("--words", type=int, default=60)
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--stagger-ms", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    return p


# The server, in this process ---------------------------------------------------------------------------------------
def serve(config: EngineConfig) -> tuple[str, uvicorn.Server, threading.Thread, Engine]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    app = create_app(config, None, shutdown_timeout=2.0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (server.started and state_of(app).engine.state is EngineState.READY):
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    return f"ws://127.0.0.1:{sock.getsockname()[1]}/v1/realtime", server, thread, state_of(app).engine


# Clients --------------------------------------------------------------------------------------------------------------
async def open_session(url: str, **settings: Any) -> ClientConnection:
    ws = await connect(url, max_size=None)
    await ws.recv()  # session.created
    await ws.send(json.dumps({"type": "session.update", "session": settings}))
    await ws.recv()  # session.updated
    return ws


async def read_response(ws: ClientConnection, run: Run) -> None:
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "response.output_audio.delta":
            data = base64.b64decode(event["delta"])
            run.deltas.append((time.perf_counter(), len(data)))
            run.audio += data
        elif event["type"] == "error":
            run.errors.append(event["error"]["message"])
        elif event["type"] == "response.done":
            run.status, run.usage = event["response"]["status"], event["response"].get("usage") or {}
            return


async def streamed(url: str, words: list[str], rate: float, seed: int, delay: float = 0.0) -> Run:
    """One session writing `words` at `rate` words per second, then committing."""
    await asyncio.sleep(delay)
    run = Run(rate, [w if i == 0 else " " + w for i, w in enumerate(words)])
    ws = await open_session(url, text_streaming=True, seed=seed)
    reader = asyncio.create_task(read_response(ws, run))
    start = time.perf_counter()
    for i, piece in enumerate(run.pieces):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        run.sent_at.append(time.perf_counter())
        await ws.send(json.dumps({"type": "input_text_buffer.append", "text": piece}))
    await ws.send(json.dumps({"type": "input_text_buffer.commit"}))
    await reader
    await ws.close()
    return run


async def whole(url: str, text: str, seed: int) -> bytes:
    """The same text at once, as an ordinary response in the streaming layout."""
    run = Run(0.0, [text])
    ws = await open_session(url, seed=seed, text_layout="streaming")
    await ws.send(json.dumps({"type": "input_text_buffer.append", "text": text}))
    await ws.send(json.dumps({"type": "input_text_buffer.commit"}))
    await read_response(ws, run)
    await ws.close()
    return run.audio


# Figures --------------------------------------------------------------------------------------------------------------
def settled_at(engine: Engine, run: Run) -> float:
    """When the client sent the piece after which the text's first token was fixed (the request started)."""
    assert engine._loaded is not None
    text = engine._loaded.frontend.tokenizer.stream()
    released = 0
    for piece, at in zip(run.pieces, run.sent_at, strict=True):
        released += len(text.append(piece))
        if released >= HEAD and text.text.strip():
            return at
    return run.sent_at[-1]


def playback(run: Run) -> dict[str, float]:
    """A client that plays from its first audio on, pausing whenever it runs dry."""
    t0 = run.deltas[0][0]
    clock, stall, stalls, need = t0, 0.0, 0, 0.0
    played = 0.0
    for at, size in run.deltas:
        need = max(need, at - (t0 + played))  # start-up buffer that would have kept it going
        if at > clock + 1e-3:
            stall, stalls = stall + at - clock, stalls + 1
        clock = max(clock, at) + size / PCM_BYTES_PER_S
        played += size / PCM_BYTES_PER_S
    return {"stalls": stalls, "stall_ms": round(stall * 1e3, 1), "buffer_needed_ms": round(need * 1e3, 1)}


def session_figures(engine: Engine, run: Run) -> dict[str, Any]:
    first = run.deltas[0][0] - settled_at(engine, run) if run.deltas else None
    frames, tokens = run.usage.get("output_tokens", 0), run.usage.get("input_tokens", 0)
    return {"words_per_s": run.rate, "status": run.status, "errors": run.errors,
            "first_audio_ms": round(first * 1e3, 1) if first else None,
            "frames": frames, "text_tokens": tokens, "audio_s": round(len(run.audio) / PCM_BYTES_PER_S, 2),
            "whole": run.status == "completed" and frames == tokens + 1 and len(run.audio) == frames * 1920 * 2,
            **(playback(run) if run.deltas else {})}


class StepRecord:
    """Rows per request id (every routed snapshot, prefills in the middle of a step included), and per step the
    sessions that held a slot without being stepped (read on the worker thread, where the scheduler lives)."""

    def __init__(self, engine: Engine) -> None:
        assert engine.pipeline is not None and engine.worker is not None
        self.rows: Counter[str] = Counter()
        self.held: dict[int, int] = {}
        engine.pipeline.tap = self
        worker = engine.worker

        def hook(where: str, batch: tuple[Any, ...]) -> None:
            if where == "step":
                self.held.setdefault(worker._step, len(worker.scheduler.running) - len(batch))

        worker.fault_hook = hook

    def __call__(self, snap: StepSnapshot, codes: np.ndarray) -> None:
        self.rows.update(rid for rid, _, _ in snap.rows)


def step_times(engine: Engine, record: StepRecord, since: int) -> dict[str, Any]:
    """Step time p50 at each common batch size, in steps when few sessions waited and when many did."""
    assert engine.worker is not None
    by_batch: defaultdict[int, list[tuple[int, float]]] = defaultdict(list)
    for t in engine.worker.timings.snapshot():
        if t.step >= since and t.sample_end and t.step in record.held:
            by_batch[t.batch].append((record.held[t.step], (t.sample_end - t.forward_start) * 1e3))
    out: dict[str, Any] = {}
    for b, steps in sorted(by_batch.items(), key=lambda kv: -len(kv[1]))[:4]:
        split = statistics.median(w for w, _ in steps)
        few, many = [ms for w, ms in steps if w <= split], [ms for w, ms in steps if w > split]
        if few and many:
            out[str(b)] = {"steps": len(steps), "waiting_split": split,
                           "step_ms_p50_few_waiting": round(statistics.median(few), 3),
                           "step_ms_p50_many_waiting": round(statistics.median(many), 3)}
    return out


# Rounds ---------------------------------------------------------------------------------------------------------------
async def alone(url: str, engine: Engine, words: list[str], rate: float, seed: int) -> dict[str, Any]:
    run = await streamed(url, words, rate, seed)
    reference = await whole(url, " ".join(words), seed)
    return session_figures(engine, run) | {"identical_to_whole_text": run.audio == reference}


async def crowd(url: str, engine: Engine, args: argparse.Namespace, words: list[str]) -> dict[str, Any]:
    assert engine.worker is not None and engine.pipeline is not None
    record, since = StepRecord(engine), engine.worker.timings.total_steps
    runs = await asyncio.gather(*(streamed(url, words, SPEEDS[k % len(SPEEDS)], args.seed + k,
                                           k * args.stagger_ms / 1e3) for k in range(args.sessions)))
    engine.pipeline.tap, engine.worker.fault_hook = None, None
    figures = [session_figures(engine, r) for r in runs]
    first = [f["first_audio_ms"] for f in figures if f["first_audio_ms"] is not None]
    return {
        "sessions": len(runs), "whole_audio": sum(f["whole"] for f in figures),
        "errors": sum(len(f["errors"]) for f in figures),
        "first_audio_ms_p50": round(statistics.median(first), 1), "first_audio_ms_max": max(first),
        # a row per frame, plus the one that made its EOS (and any the worker stepped before it saw the EOS)
        "talker_rows": sum(record.rows.values()), "frames_plus_eos": sum(f["frames"] for f in figures) + len(runs),
        "stalls_by_speed": {str(s): sum(f.get("stalls", 0) for f in figures if f["words_per_s"] == s) for s in SPEEDS},
        "buffer_needed_ms_max_by_speed": {str(s): max(f.get("buffer_needed_ms", 0) for f in figures
                                                      if f["words_per_s"] == s) for s in SPEEDS},
        "step_time_by_batch": step_times(engine, record, since),
        "per_session": figures,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    text = TEXT.split(" ")
    words = (text * (args.words // len(text) + 1))[: args.words]
    config = EngineConfig.from_env(model="tiny", max_batch=max(32, args.sessions), max_len=4096,
                                   max_frames=2048).tuned(timing_ring=1 << 17)
    url, server, thread, engine = serve(config)
    try:
        fast = await alone(url, engine, words, 4.0, args.seed)
        print("alone, 4 words/s:", json.dumps(fast), flush=True)
        slow = await alone(url, engine, words, 1.0, args.seed)
        print("alone, 1 word/s: ", json.dumps(slow), flush=True)
        many = await crowd(url, engine, args, words)
        summary = {k: v for k, v in many.items() if k != "per_session"}
        print(f"{args.sessions} sessions:", json.dumps(summary), flush=True)
    finally:
        server.should_exit = True
        thread.join(30)
    return {"bench": "text-stream", "words": args.words, "fast": fast, "slow": slow, "crowd": many}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(out))
    ok = out["fast"]["identical_to_whole_text"] and out["slow"]["identical_to_whole_text"]
    ok = ok and not out["fast"]["errors"] and not out["slow"]["errors"] and not out["crowd"]["errors"]
    return 0 if ok and out["crowd"]["whole_audio"] == out["crowd"]["sessions"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

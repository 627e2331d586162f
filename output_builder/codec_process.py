"""The codec-decode worker as a child process that owns the codec model and every request's decoder state.

Why a process: on CPU the Talker step and the codec decode are both streams of small torch ops, and two threads of
one interpreter hand the GIL back and forth at every op (measured: the Talker step doubles). A child process decodes
truly beside the decode loop. Jobs go down a pipe as small code arrays; 16-bit PCM comes back.

Two lanes, two pipes: the backlog lane, and an urgent lane for new requests' first chunks. The child serves an
urgent call between the stages of a backlog call (a few ms apart) rather than after the whole call, on its one
thread, so neither call's arithmetic changes: each call computes exactly what it computes alone.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common.children import die_with_parent, spawn

if TYPE_CHECKING:
    from output_builder.primed import PrimedStates

START_TIMEOUT_S = 120.0
GONE_MAX = 4096  # closed streams remembered without state (see decode_batch)


class CodecProcessError(RuntimeError):
    """The codec process failed or died."""


@dataclass(slots=True)
class DecodeRequest:
    jobs: list[tuple[int, np.ndarray]]  # (stream id, codes [G, N] int)
    closed: list[int] = field(default_factory=list)  # stream ids whose state can be dropped
    context: dict[int, int] = field(default_factory=dict)  # a new stream's leading frames that prime it, unheard
    peek: set[int] = field(default_factory=set)  # streams decoded on a copy of their state, which stays as it was


def to_pcm16(wave: np.ndarray) -> np.ndarray:
    """float [-1, 1] -> int16, rounding to nearest."""
    return np.clip(np.rint(wave * 32767.0), -32768, 32767).astype(np.int16)


def decode_batch(
    codec: object, states: dict[int, object], req: DecodeRequest, gone: OrderedDict[int, None] | None = None,
    primed: PrimedStates | None = None,
) -> list[np.ndarray]:
    """The one decode routine, shared by the child process and the in-process (sync mode) path.

    `gone` (the codec process, whose two lanes can cross): streams closed before any job of theirs came. A job
    that comes after its stream's close (its first chunk, sent on the urgent lane just as the stream was
    cancelled) is decoded on a state that is not kept. A new stream with `context` frames starts from a state
    that has decoded them (`primed` keeps those by their codes), and only the frames after them are heard."""
    import torch

    from output_builder.primed import PrimedStates as Primed

    try:
        pairs = []
        size = codec.config.codebook_size  # type: ignore[attr-defined]
        for sid, codes in req.jobs:
            if codes.size and (codes.min() < 0 or codes.max() >= size):
                # on CUDA an out-of-range lookup is a device-side assert that ends the process: fail this call only
                raise ValueError(f"codes outside the codebook [0, {size}) for stream {sid}")
            state, n = states.get(sid), req.context.get(sid, 0)
            if state is not None and sid in req.peek:
                state = state.copy()  # type: ignore[attr-defined]
            elif state is None:
                fresh = primed if primed is not None else Primed(0)  # an empty cache is falsy (__len__)
                state = fresh.open(codec, codes[:, :n]) if n else codec.open_stream()  # type: ignore
                codes = codes[:, n:]
                if gone is not None and sid in gone:
                    del gone[sid]  # a late job of a closed stream: decoded, not kept
                elif sid not in req.peek:
                    states[sid] = state
            pairs.append((state, torch.from_numpy(np.ascontiguousarray(codes)).long()))
        waves = codec.decode_streams(pairs)  # type: ignore[attr-defined]
        return [to_pcm16(w.numpy()) for w in waves]
    finally:  # after the jobs: a stream closed while its last job was on the way is not reopened for good
        for sid in req.closed:
            if states.pop(sid, None) is None and gone is not None:
                gone[sid] = None
                if len(gone) > GONE_MAX:
                    gone.popitem(last=False)


def _answer(conn: Connection, codec: object, states: dict[int, object], req: DecodeRequest,
            gone: OrderedDict[int, None], primed: PrimedStates) -> None:
    try:
        conn.send(("ok", decode_batch(codec, states, req, gone, primed)))
    except Exception as exc:
        for sid, _ in req.jobs:
            states.pop(sid, None)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _serve(conn: Connection, urgent: Connection, path: str, device: str, threads: int, native: bool,
           nice: int) -> None:
    import torch

    from common.children import lower_priority
    from output_builder.codecs.native import load_native
    from output_builder.codecs.qwen12hz import Qwen12HzCodec

    torch.set_num_threads(threads)
    lower_priority(nice)
    try:
        codec = Qwen12HzCodec.from_pretrained(Path(path), device=torch.device(device))
        codec.use_native(load_native() if native else None)
        conn.send(("ready", {"native_kernels": codec.native_kernels}))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    from output_builder.primed import PrimedStates as Primed

    states: dict[int, object] = {}
    gone: OrderedDict[int, None] = OrderedDict()
    primed = Primed()

    def serve_urgent() -> None:  # between the stages of a backlog call (a poll when nothing waits)
        while urgent.poll():
            codec.between_stages(None)  # an urgent call itself is not cut
            try:
                _answer(urgent, codec, states, urgent.recv(), gone, primed)
            finally:
                codec.between_stages(serve_urgent)

    codec.between_stages(serve_urgent)
    while True:
        try:
            if urgent in wait([conn, urgent]):
                serve_urgent()
                continue
            req = conn.recv()
            if req is None:
                return
            _answer(conn, codec, states, req, gone, primed)
        except (EOFError, OSError):  # the parent is gone
            return


class CodecProcess:
    """Parent side. `decode` is called by one thread per lane at a time (the codec worker threads)."""

    def __init__(self, path: Path, device: str, threads: int, native: bool = False, nice: int = 0) -> None:
        (ours, theirs), (ours_u, theirs_u) = socket.socketpair(), socket.socketpair()
        cmd = [sys.executable, "-m", "output_builder.codec_process", str(theirs.fileno()), str(theirs_u.fileno()),
               str(path), device, str(threads), "1" if native else "", str(nice), str(os.getpid())]
        self._proc = spawn(cmd, pass_fds=(theirs.fileno(), theirs_u.fileno()))
        theirs.close()
        theirs_u.close()
        self._conn, self._urgent = Connection(ours.detach()), Connection(ours_u.detach())
        self._closed: list[int] = []
        self._locks = {False: threading.Lock(), True: threading.Lock()}
        if not self._conn.poll(START_TIMEOUT_S):
            self.stop()
            raise CodecProcessError("the codec process did not start in time")
        status, detail = self._conn.recv()
        if status != "ready":
            self.stop()
            raise CodecProcessError(f"the codec process failed to load: {detail}")
        self.native_kernels: bool = detail["native_kernels"]

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close_stream(self, sid: int) -> None:
        """Any thread: the stream's state is dropped with the next request."""
        self._closed.append(sid)

    def decode(self, jobs: list[tuple[int, np.ndarray]], urgent: bool = False,
               context: dict[int, int] | None = None, peek: set[int] | None = None) -> list[np.ndarray]:
        """One call on a lane; one thread per lane at a time. Closed streams go with backlog calls, which are
        the ones that carry a stream's last chunk."""
        closed: list[int] = []
        if not urgent:
            closed, self._closed = self._closed, []
        conn = self._urgent if urgent else self._conn
        with self._locks[urgent]:
            try:
                conn.send(DecodeRequest(jobs, closed, context or {}, peek or set()))
                status, payload = conn.recv()
            except (EOFError, OSError) as exc:
                raise CodecProcessError(f"the codec process died: {exc!r}") from exc
        if status != "ok":
            raise CodecProcessError(str(payload))
        pcm: list[np.ndarray] = payload
        return pcm

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(None)
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
        self._conn.close()
        self._urgent.close()


if __name__ == "__main__":
    die_with_parent(int(sys.argv[8]))
    _serve(Connection(int(sys.argv[1])), Connection(int(sys.argv[2])), sys.argv[3], sys.argv[4], int(sys.argv[5]),
           bool(sys.argv[6]), int(sys.argv[7]))

"""The voice process: a child that runs a Base checkpoint's encoders (talker/voices/clone.py) for clone prompts.

A plain subprocess speaking over one socket pair (the codec process's way, not `multiprocessing`, whose resource
tracker outlives a killed server), started from the long-lived spawner thread and killed by the kernel when the
server goes (talker/children.py). Started on the first clone, restarted on the next after it dies.

Down the pipe: ("prompt", wav, transcript), ("stats",), or None to stop. Back: ("ok", value), ("error",
RequestError) for a reference the encoders refuse, or ("failed", text) for anything else."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from talker.children import die_with_parent, spawn
from talker.request import ClonePrompt, RequestError, RequestFailedError

STOP_TIMEOUT_S = 5.0
# A clone's budget: a 30 s reference takes ~4 s at the 0.6B sizes on a 2-core CPU. Past it the child is taken to be
# hung (it would hold every queued clone behind it): it is killed, and the next clone starts another.
CALL_TIMEOUT_S = 120.0


class VoiceProcess:
    """The parent's side. Calls are blocking and serialised; the engine's clone queue makes one at a time."""

    def __init__(self, directory: Path, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.directory, self.timeout_s = directory, timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        """The running child's, if one runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def prompt(self, wav: np.ndarray, transcript: str | None) -> ClonePrompt:
        """wav: [samples] float32 mono at 24 kHz. With a transcript: in-context cloning; without: x-vector only."""
        prompt: ClonePrompt = self._call(("prompt", np.ascontiguousarray(wav, np.float32), transcript or None))
        return prompt

    def stats(self) -> dict[str, int]:
        """The child's counts: `prompts`, the encoder runs it has made (0 when none runs)."""
        with self._lock:
            if self._conn is None:
                return {"prompts": 0}
        counts: dict[str, int] = self._call(("stats",))
        return counts

    def _call(self, message: tuple[Any, ...]) -> Any:
        with self._lock:
            conn = self._connection()
            try:
                _send_timeout(conn.fileno(), self.timeout_s)  # a send the child does not read fails then
                conn.send(message)
                answered = conn.poll(self.timeout_s)
                reply: tuple[str, Any] = conn.recv() if answered else ("timeout", None)
            except BlockingIOError:
                reply = ("timeout", None)
            except (EOFError, OSError):
                self._reap()  # the next call starts a new process
                raise RequestFailedError("the voice encoder process died; try again",
                                         code="voice_encoder_error") from None
            status, value = reply
            if status == "timeout":
                self._reap()
                raise RequestFailedError(f"the voice encoder took longer than {self.timeout_s:g} s and was stopped; "
                                         "try again", code="voice_encoder_timeout")
        if status == "error":
            raise value
        if status != "ok":
            raise RequestFailedError(f"the voice encoder failed: {value}", code="voice_encoder_error")
        return value

    def _connection(self) -> Connection:
        if self._conn is None:
            ours, theirs = socket.socketpair()
            cmd = [sys.executable, "-m", "talker.voices.process", str(theirs.fileno()), str(self.directory),
                   str(os.getpid())]
            try:
                self._proc = spawn(cmd, pass_fds=(theirs.fileno(),))
            finally:
                theirs.close()
            self._conn = Connection(ours.detach())
        return self._conn

    def _reap(self) -> None:
        conn, proc, self._conn, self._proc = self._conn, self._proc, None, None
        if conn is not None:
            conn.close()
        if proc is not None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the child: it finishes the call it is on (if any), then ends; killed if that does not come in time
        (its caller then sees the process die)."""
        if not self._lock.acquire(timeout=STOP_TIMEOUT_S):
            if (proc := self._proc) is not None:
                proc.kill()
            return
        try:
            if self._conn is not None and self._proc is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._conn.send(None)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(STOP_TIMEOUT_S)
            self._reap()
        finally:
            self._lock.release()


def _send_timeout(fd: int, seconds: float) -> None:
    """SO_SNDTIMEO on the connection's socket (borrowed, not closed): a write that blocks that long raises
    BlockingIOError."""
    sock = socket.socket(fileno=fd)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(seconds), int(seconds % 1 * 1e6)))
    finally:
        sock.detach()


def _serve(conn: Connection, directory: Path) -> None:
    import torch

    from talker.device import lower_priority
    from talker.voices.clone import VOICE_NICE, Encoders

    torch.set_num_threads(1)
    lower_priority(VOICE_NICE)
    encoders, prompts = Encoders(directory), 0
    while (message := conn.recv()) is not None:
        if message[0] == "stats":
            conn.send(("ok", {"prompts": prompts}))
            continue
        _, wav, transcript = message
        prompts += 1
        try:
            conn.send(("ok", encoders.prompt(wav, transcript)))
        except RequestError as exc:
            conn.send(("error", exc))
        except Exception as exc:
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    die_with_parent(int(sys.argv[3]))
    with contextlib.suppress(EOFError, OSError):  # the parent is gone
        _serve(Connection(int(sys.argv[1])), Path(sys.argv[2]))

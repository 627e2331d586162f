"""A model in a child process of its own: the parent's side, shared by the voice process (engine/voices/process.py)
and the aligner process (engine/aligner/process.py). Torch-free.

A plain subprocess speaking over one socket pair (the codec process's way, not `multiprocessing`, whose resource
tracker outlives a killed server), started from the long-lived spawner thread and killed by the kernel when the
server goes (common/children.py). Started on the first call, restarted on the next after it dies.

Down the pipe: a tuple naming what to do, or None to stop. Back: ("ok", value), ("error", RequestError) for input
the model refuses, or ("failed", text) for anything else."""

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

from common.children import spawn
from common.request import RequestFailedError

STOP_TIMEOUT_S = 5.0


class ModelProcess:
    """The parent's side. Calls are blocking and serialised. `module` is the child's (run with `python -m`, given
    the socket's descriptor, `directory`, the parent's pid and `args`); `what` names it in errors, `code` is their
    code's stem (`<code>_error`, `<code>_timeout`)."""

    module = ""
    what = ""
    code = ""

    def __init__(self, directory: Path, timeout_s: float, args: tuple[str, ...] = ()) -> None:
        self.directory, self.timeout_s, self.args = directory, timeout_s, args
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        """The running child's, if one runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

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
                raise RequestFailedError(f"the {self.what} process died; try again",
                                         code=f"{self.code}_error") from None
            status, value = reply
            if status == "timeout":
                self._reap()
                raise RequestFailedError(f"the {self.what} took longer than {self.timeout_s:g} s and was stopped; "
                                         "try again", code=f"{self.code}_timeout")
        if status == "error":
            raise value
        if status != "ok":
            raise RequestFailedError(f"the {self.what} failed: {value}", code=f"{self.code}_error")
        return value

    def _connection(self) -> Connection:
        if self._conn is None:
            ours, theirs = socket.socketpair()
            cmd = [sys.executable, "-m", self.module, str(theirs.fileno()), str(self.directory), str(os.getpid()),
                   *self.args]
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

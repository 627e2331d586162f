"""Child processes that die with the server: the codec process and the voice process are plain subprocesses
speaking over pipes (not `multiprocessing`, whose resource tracker would outlive the server), each started from
one long-lived thread and each asking the kernel to kill it when its parent goes. Torch-free."""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future

log = logging.getLogger("talkstream.children")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """In the child, first thing: be SIGKILLed when the parent goes, however it ends (SIGKILL and os._exit
    included), so that a hung child never outlives its server. Linux only; elsewhere the pipes' EOF ends an idle
    child. A terminal's Ctrl-C goes to the whole process group, yet the server ends its children itself: they
    ignore it (no traceback from each)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
    if os.getppid() != parent_pid:  # the parent died before the prctl: no signal will come
        os._exit(1)


class _Spawner:
    """Starts child processes from one thread that lives as long as the process.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process. A child started from
    `asyncio.to_thread` (the engine loads its codec process there; the voice process starts on the first clone, on
    whichever thread asks) would be killed when that executor thread exits, which can be before the engine stops
    (an idle executor thread retires; an engine can outlive the loop that started it, as test fixtures can). This
    daemon thread never returns, so the signal comes only when the whole process ends.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]]
        self._jobs = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def popen(self, cmd: list[str], pass_fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="child-spawner", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((lambda: subprocess.Popen(cmd, pass_fds=pass_fds), done))
        return done.result()

    def _run(self) -> None:
        while True:
            start, done = self._jobs.get()
            try:
                done.set_result(start())
            except BaseException as exc:
                done.set_exception(exc)


spawn = _Spawner().popen

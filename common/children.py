"""Child processes that die with the server: the codec process and the voice process are plain subprocesses
speaking over pipes (not `multiprocessing`, whose resource tracker would outlive the server), each started from
one long-lived thread and each asking the kernel to kill it when its parent goes; and the CPU priority a child
or a thread runs at. Torch-free."""

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
from pathlib import Path

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


def lower_priority(nice: int) -> None:
    """Raise the calling thread's nice value by `nice` (Linux: per thread; elsewhere the whole process)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id() if sys.platform == "linux" else 0
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))
    except OSError as exc:
        log.warning("could not lower the CPU priority of %s: %s", threading.current_thread().name, exc)


def idle_only() -> None:
    """Every thread of this process (a thread pool the process already started too), and the threads they start
    later, run only when a CPU has nothing else to run (Linux's SCHED_IDLE: a waking thread of any other policy
    preempts them at once, where nice 19 still takes a share and a time slice); elsewhere the lowest nice value."""
    tasks = Path("/proc/self/task")
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE") and tasks.is_dir():
        try:
            for tid in tasks.iterdir():
                os.sched_setscheduler(int(tid.name), os.SCHED_IDLE, os.sched_param(0))
            return
        except OSError as exc:
            log.warning("could not run the process under SCHED_IDLE: %s", exc)
    lower_priority(19)

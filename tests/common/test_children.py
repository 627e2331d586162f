"""A child made with `spawn` that calls `die_with_parent` ends when its parent is SIGKILLed (no chance to stop it),
even though the thread that asked for it ended long before."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = "import sys, time; from common.children import die_with_parent; die_with_parent(int(sys.argv[1])); " \
        "print('armed', flush=True); time.sleep(600)"
PARENT = f"""
import os, sys, threading, time
from common.children import spawn
started = []
asker = threading.Thread(target=lambda: started.append(spawn([sys.executable, "-c", {CHILD!r}, str(os.getpid())], ())))
asker.start()
asker.join()
print(started[0].pid, flush=True)
time.sleep(600)
"""


def ended(pid: int) -> bool:
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()  # ended; its new parent has not reaped it
    except FileNotFoundError:
        return True


def test_a_spawned_child_dies_with_its_killed_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert parent.stdout.readline() == "armed\n"  # the child's stdout is its parent's
        assert not ended(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 20  # a failure's bound only
        while not ended(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()

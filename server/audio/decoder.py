"""The decoder processes that decode clients' audio files (server/audio/decoder_process.py), and the bounded queue in
front of them. The event loop only awaits a future: a file's decode holds no GIL of the server's, each file has a
time budget (past it its process is killed and replaced) and a memory ceiling, and a full queue is a 429.

One pool per process (`POOL`), shared by the apps in it: each app's lifespan opens it and closes it, and the
processes start with the first file and stop when the last app closes. Each process belongs to one worker thread,
which started it and outlives it: the kernel kills a child when the thread that started it ends (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import queue
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from server import errors
from server.audio.decoder_process import ENV, HEADER, KINDS, MAX_SECONDS, Refusal

log = logging.getLogger("talkstream.server")
WORKERS = 2  # files decoded at once
QUEUE_SIZE = 8  # files waiting for a decoder; one more is a 429
TIME_BUDGET_S = 10.0  # the slowest file within the limits (30 s at 384 kHz, 8 channels) takes ~1.3 s on a loaded core
MEMORY_BUDGET = 512 * 2**20  # a decoder's heap: a 30 s file peaks near 105 MiB (RLIMIT_DATA, decoder_process.py)
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 2.0
RETRY_AFTER_S = 1.0
_ROOT = Path(__file__).resolve().parents[2]  # where `server` is imported from, for the child's `-m`


class _Failed(Exception):
    """A decoder process did not start."""


class _Ended(Exception):
    """A decoder process ended while it had a file (it crashed, or the pool is stopping)."""


class _Decoder:
    """One decoder process; used by its worker thread, which started it (`kill` may come from another thread)."""

    def __init__(self) -> None:
        cmd = [sys.executable, "-m", "server.audio.decoder_process", str(os.getpid()), str(MEMORY_BUDGET)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, cwd=_ROOT,
                                     env={**os.environ, **ENV})
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out, self._in = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        # poll, not select: the server's descriptors can be numbered past select's 1024
        self._writable, self._readable = select.poll(), select.poll()
        self._writable.register(self._out, select.POLLOUT)
        self._readable.register(self._in, select.POLLIN)

    def wait_ready(self) -> None:
        if not self._answer(time.monotonic() + START_TIMEOUT_S).get("ready"):
            raise _Ended

    def decode(self, data: bytes, budget_s: float) -> np.ndarray:
        """The file's samples; Refusal for what the client sent; _Ended or TimeoutError, after which the process
        must be killed."""
        deadline = time.monotonic() + budget_s
        self._send(HEADER.pack(len(data)) + data, deadline)
        answer = self._answer(deadline)
        if not answer.get("ok"):
            raise Refusal(str(answer.get("code")), str(answer.get("message")))
        return np.frombuffer(self._read(4 * int(str(answer["samples"])), deadline), np.float32)

    def kill(self) -> None:
        """Any thread: the worker's read or write then ends (_Ended)."""
        self.proc.kill()

    def close(self) -> None:
        """Its worker thread: EOF on stdin ends an idle decoder; one that does not end soon is killed."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _answer(self, deadline: float) -> dict[str, object]:
        try:
            head = json.loads(self._read(HEADER.unpack(self._read(HEADER.size, deadline))[0], deadline))
        except ValueError:  # not what a decoder process writes
            raise _Ended from None
        if not isinstance(head, dict):
            raise _Ended
        return head

    def _send(self, payload: bytes, deadline: float) -> None:
        view = memoryview(payload)
        while view:
            self._wait(self._writable, deadline)
            try:
                view = view[os.write(self._out, view):]
            except BrokenPipeError:
                raise _Ended from None

    def _read(self, n: int, deadline: float) -> bytearray:
        buf = bytearray()
        while len(buf) < n:
            self._wait(self._readable, deadline)
            chunk = os.read(self._in, min(n - len(buf), 1 << 20))
            if not chunk:
                raise _Ended
            buf += chunk
        return buf

    @staticmethod
    def _wait(poll: select.poll, deadline: float) -> None:
        if not poll.poll(max(0, math.ceil((deadline - time.monotonic()) * 1000))):
            raise TimeoutError


@dataclass(slots=True)
class _Job:
    data: bytes
    budget_s: float
    done: Future[np.ndarray]


class _Crew:
    """The worker threads and their decoders, from the first file until the pool's last user closes it."""

    def __init__(self, workers: int, queue_size: int) -> None:
        self.jobs: queue.Queue[_Job | None] = queue.Queue(queue_size)
        self.decoding = 0  # files in a decoder now
        self._decoders: set[_Decoder] = set()
        self._stopping = False
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, name=f"audio-decoder-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def pids(self) -> list[int]:
        with self._lock:
            return [d.proc.pid for d in self._decoders]

    def stop(self) -> None:
        """Files still waiting get a 503; idle decoders get EOF; one still decoding after STOP_GRACE_S is killed."""
        with self._lock:
            self._stopping = True
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.done.set_running_or_notify_cancel():
                job.done.set_exception(errors.shutting_down())
        for _ in self._threads:
            self.jobs.put(None)
        deadline = time.monotonic() + STOP_GRACE_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for decoder in self._decoders:
                decoder.kill()
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        decoder = self._replace()  # every worker's at once: the second file does not wait for one to start
        while (job := self.jobs.get()) is not None:
            if not job.done.set_running_or_notify_cancel():
                continue  # its client went away while it waited
            try:
                decoder = decoder or self._start()
                job.done.set_result(self._decode(decoder, job))
            except Refusal as exc:
                job.done.set_exception(exc)
            except Exception as exc:  # the decoder is gone or past its time: killed, the file refused, replaced
                failure = self._failure(decoder, exc, job.budget_s)
                self._retire(decoder)
                job.done.set_exception(failure)
                decoder = self._replace()
        self._retire(decoder, kill=False)

    def _start(self) -> _Decoder:
        try:
            decoder = _Decoder()
        except OSError as exc:
            raise _Failed(str(exc)) from exc
        with self._lock:
            self._decoders.add(decoder)
            if self._stopping:
                decoder.kill()
        try:
            decoder.wait_ready()
        except (_Ended, TimeoutError) as exc:
            self._retire(decoder)
            raise _Failed(f"it did not start (exit status {decoder.proc.poll()})") from exc
        return decoder

    def _replace(self) -> _Decoder | None:
        """A decoder started now, unless stopping; None if it does not start (the next file tries again)."""
        if self._stopping:
            return None
        try:
            return self._start()
        except _Failed as exc:
            log.warning("an audio decoder process did not start: %s", exc)
            return None

    def _decode(self, decoder: _Decoder, job: _Job) -> np.ndarray:
        with self._lock:
            self.decoding += 1
        try:
            return decoder.decode(job.data, job.budget_s)
        finally:
            with self._lock:
                self.decoding -= 1

    def _retire(self, decoder: _Decoder | None, kill: bool = True) -> None:
        if decoder is not None:
            with self._lock:
                self._decoders.discard(decoder)
            if kill:
                decoder.kill()
            decoder.close()

    def _failure(self, decoder: _Decoder | None, exc: Exception, budget_s: float) -> Exception:
        if self._stopping:
            return errors.shutting_down()
        if isinstance(exc, _Failed):
            log.warning("an audio decoder process did not start: %s", exc)
            return errors.unavailable("the audio decoder did not start; retry shortly", code="decoder_unavailable")
        if isinstance(exc, TimeoutError):
            return Refusal("audio_too_complex", f"decoding it took longer than {budget_s:g} s, the budget for one "
                           f"file; send a plain wav, mp3 or flac of at most {MAX_SECONDS:g} s")
        status = None if decoder is None else decoder.proc.poll()
        log.warning("an audio decoder process failed on a client's file (exit status %s): %r", status, exc)
        return Refusal("invalid_audio", f"could not be decoded as audio (its decoder ended); send a {KINDS} file")


class DecoderPool:
    """What routes call (through `audio_input.decode_async`). `time_budget_s` applies to files submitted after it
    is set."""

    def __init__(self, workers: int = WORKERS, queue_size: int = QUEUE_SIZE,
                 time_budget_s: float = TIME_BUDGET_S) -> None:
        self.workers, self.queue_size, self.time_budget_s = workers, queue_size, time_budget_s
        self._lock = threading.Lock()
        self._users = 0
        self._crew: _Crew | None = None

    async def decode(self, data: bytes) -> np.ndarray:
        """24 kHz mono float32 samples; Refusal for what the client sent; ApiError 429 when the queue is full."""
        job = _Job(data, self.time_budget_s, Future())
        with self._lock:
            if self._crew is None:
                self._crew = _Crew(self.workers, self.queue_size)
            try:
                self._crew.jobs.put_nowait(job)
            except queue.Full:
                raise errors.busy(f"{self.workers + self.queue_size} audio files are being decoded or wait for it; "
                                  "retry shortly", RETRY_AFTER_S) from None
        return await asyncio.wrap_future(job.done)

    def open(self) -> None:
        """An app's lifespan starts: the pool is kept until every app that opened it has closed it."""
        with self._lock:
            self._users += 1

    def close(self) -> None:
        """Blocking (a decoder still at work gets STOP_GRACE_S): call it off the event loop."""
        with self._lock:
            self._users = max(0, self._users - 1)
            crew, self._crew = (self._crew, None) if self._users == 0 else (None, self._crew)
        if crew is not None:
            crew.stop()

    @property
    def decoding(self) -> int:
        """Files in a decoder process now."""
        crew = self._crew
        return 0 if crew is None else crew.decoding

    @property
    def waiting(self) -> int:
        """Files waiting for a decoder process."""
        crew = self._crew
        return 0 if crew is None else crew.jobs.qsize()

    def pids(self) -> list[int]:
        crew = self._crew
        return [] if crew is None else crew.pids()


POOL = DecoderPool()

"""`talkstream serve` as a subprocess: a dead engine exits the process; SIGTERM (or SIGHUP) drains (503 for anything
new, in-flight responses finish within --shutdown-timeout, the rest is cut), then exits in bounded time; a second
signal hurries; no child (the codec process, the voice process) outlives the server, however it ends; a full clone
queue is 429; the open-file limit is raised at start."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.conftest import OFFICIAL_BASE, VOICE_REF
from tests.server.leaks import scrape
from tests.server.rawclient import LAST_CHUNK, events_until_close, raw_request, raw_ws, read_response, send_text
from tests.server.test_abort_paths import LONG_TEXT, speech


class Served:
    def __init__(self, cache: Path, *flags: str, soft_nofile: int | None = None,
                 env: dict[str, str] | None = None, log: Path | None = None) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "TALKSTREAM_CACHE_DIR": str(cache), **(env or {})}
        cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(self.port), "--log-level", "warning", *flags]
        if soft_nofile is not None:  # started with a lower soft open-file limit (the shell execs: same pid)
            cmd = ["sh", "-c", f'ulimit -Sn {soft_nofile} && exec "$@"', "sh", *cmd]
        with log.open("wb") if log else contextlib.nullcontext() as err:  # `log`: its stderr goes there
            self.proc = subprocess.Popen(cmd, env=env, stderr=err)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the server did not become ready")

    def children(self) -> list[int]:
        """Child processes (the codec process), whichever thread started them."""
        tasks = Path(f"/proc/{self.proc.pid}/task").glob("*/children")
        return [int(p) for path in tasks for p in path.read_text().split()]


@pytest.fixture
def serve(tiny_cache: Path, tiny_dir: Path) -> Iterator[type[Served]]:
    started: list[Served] = []

    def make(*flags: str, **options: Any) -> Served:
        s = Served(tiny_cache, *flags, **options)
        started.append(s)
        return s

    yield make  # type: ignore[misc]
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
        s.proc.wait(10)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_a_dead_engine_exits_the_process(serve: type[Served]) -> None:
    server = serve()
    [codec] = server.children()
    os.kill(codec, signal.SIGKILL)  # the codec process dies: the engine cannot go on
    saw_503 = False
    deadline = time.monotonic() + 20
    while server.proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            saw_503 = saw_503 or httpx.get(server.url + "/health", timeout=1).status_code == 503
        time.sleep(0.1)
    assert server.proc.poll() == 3 and saw_503


MEDIUM_TEXT = "This sentence keeps going on and on so that the audio lasts for a good while. " * 2  # ~7 s
OPEN_WS, OPEN_HTTP = 'talkstream_open_responses{protocol="ws"}', 'talkstream_open_responses{protocol="http"}'


def wait_for(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def nothing_open(url: str) -> bool:
    """No response is open at the server any more, or the server is gone (it exits once nothing is)."""
    try:
        metrics = scrape(url)
    except httpx.TransportError:
        return True
    return metrics[OPEN_WS] == metrics[OPEN_HTTP] == 0


def commit(sock: socket.socket, text: str) -> None:
    send_text(sock, {"type": "session.update", "session": {"temperature": 0.0}})
    send_text(sock, {"type": "input_text_buffer.append", "text": text})
    send_text(sock, {"type": "input_text_buffer.commit"})


def test_sigterm_drains_then_exits(serve: type[Served]) -> None:
    """Ordered by events: the idle session is closed while every response is still in flight; the responses that
    can finish do (`completed`, whole); the rest are cut when --shutdown-timeout passes; then the process exits."""
    server = serve("--shutdown-timeout", "5")
    [codec] = server.children()
    # none of the raw clients reads before the signal, so their responses are all still in flight at the server
    stack = contextlib.ExitStack()
    finishing_ws, cut_ws = stack.enter_context(raw_ws(server.url)), stack.enter_context(raw_ws(server.url))
    commit(finishing_ws, MEDIUM_TEXT)
    commit(cut_ws, LONG_TEXT)
    finishing_http = stack.enter_context(raw_request(server.url, speech(input=MEDIUM_TEXT)))
    cut_http = stack.enter_context(raw_request(server.url, speech()))
    try:
        idle = stack.enter_context(connect(server.url.replace("http", "ws") + "/v1/realtime"))
        idle.recv(timeout=30)
        wait_for(lambda: scrape(server.url)[OPEN_WS] == 2 and scrape(server.url)[OPEN_HTTP] == 2, 10)
        server.proc.send_signal(signal.SIGTERM)
        with pytest.raises(ConnectionClosed) as closed:  # an idle session is closed at once ...
            idle.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        metrics = scrape(server.url)  # ... not when the drain ends: every response is still open
        assert metrics[OPEN_WS] == 2 and metrics[OPEN_HTTP] == 2
        refused = httpx.post(server.url + "/v1/audio/speech", json=speech(), timeout=5)  # the listener is open
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "server_shutting_down" and refused.headers["connection"] == "close"
        assert httpx.get(server.url + "/health", timeout=5).json()["status"] == "draining"
        assert httpx.get(server.url + "/metrics", timeout=5).status_code == 200
        with pytest.raises(InvalidStatus) as denied:
            connect(server.url.replace("http", "ws") + "/v1/realtime", open_timeout=5)
        assert denied.value.response.status_code == 503

        events, code = events_until_close(finishing_ws)  # finished (not cut: within the drain), then closed
        assert events[-1]["type"] == "response.done" and events[-1]["response"]["status"] == "completed"
        assert code == 1012
        body = read_response(finishing_http, timeout=30)
        assert body.startswith(b"HTTP/1.1 200") and body.endswith(LAST_CHUNK)  # the whole chunked response

        wait_for(lambda: nothing_open(server.url), 60)  # the drain's timeout passed: the rest is cut (unread)
        events, code = events_until_close(cut_ws)
        done = events[-1]
        assert done["type"] == "response.done" and done["response"]["status"] == "failed"
        assert done["response"]["status_details"]["error"]["code"] == "server_shutting_down" and code == 1012
        body = read_response(cut_http, timeout=30)
        assert body.startswith(b"HTTP/1.1 200") and not body.endswith(LAST_CHUNK)  # truncated
        assert server.proc.wait(30) == 0  # the wait's bound is a failure timeout only
    finally:
        stack.close()
    with pytest.raises(httpx.TransportError):
        httpx.post(server.url + "/v1/audio/speech", json=speech(), timeout=2)
    assert not alive(codec)


def test_a_second_signal_cuts_the_drain_short(serve: type[Served]) -> None:
    server = serve("--shutdown-timeout", "600")
    stalled = raw_request(server.url, speech())  # never read: it would hold the drain for ten minutes
    try:
        wait_for(lambda: scrape(server.url)[OPEN_HTTP] == 1, 10)
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(server.url + "/health", timeout=5).json()["status"] == "draining", 30)
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(60) == 0  # far sooner than the drain's ten minutes, which nothing else would end
    finally:
        stalled.close()


def test_sighup_drains_like_sigterm(serve: type[Served]) -> None:
    server = serve("--shutdown-timeout", "600")
    stalled = raw_request(server.url, speech())  # never read: it holds the drain open
    try:
        wait_for(lambda: scrape(server.url)[OPEN_HTTP] == 1, 10)
        server.proc.send_signal(signal.SIGHUP)  # by default SIGHUP ends a process at once, listener and all
        wait_for(lambda: httpx.get(server.url + "/health", timeout=5).json()["status"] == "draining", 10)
        refused = httpx.post(server.url + "/v1/audio/speech", json=speech(), timeout=5)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
        server.proc.send_signal(signal.SIGHUP)  # a second one cuts the drain short, as for SIGTERM
        assert server.proc.wait(60) == 0
    finally:
        stalled.close()


def test_sighup_reloads_a_lexicon_and_the_server_goes_on(serve: type[Served], tmp_path: Path) -> None:
    """With a lexicon, SIGHUP reads it again instead of draining; a broken file keeps the one in use."""
    lexicon = tmp_path / "lexicon.json"
    lexicon.write_text('{"SQL": "sequel"}', encoding="utf-8")
    log = tmp_path / "stderr.log"
    server = serve("--lexicon", str(lexicon), "--log-level", "info", log=log)

    def transcript() -> str:
        body = {**speech(), "input": "I like SQL.", "stream_format": "sse"}
        with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=60) as resp:
            events = [line for line in resp.iter_lines() if line.startswith("data: ")]
        return str(json.loads(events[-1][6:])["transcript"])

    assert transcript() == "I like sequel."
    lexicon.write_text('{"SQL": "ess queue ell"}', encoding="utf-8")
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reloaded its lexicon: 1 entries" in log.read_text(), 20)
    assert transcript() == "I like ess queue ell."
    lexicon.write_text("{broken", encoding="utf-8")
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "keeps the lexicon it had" in log.read_text(), 20)
    assert transcript() == "I like ess queue ell."
    assert httpx.get(server.url + "/health", timeout=5).json()["status"] == "ready" and server.proc.poll() is None


def gone(pid: int) -> bool:
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not alive(pid), 20)
    return not alive(pid)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process hung (SIGSTOP): it can read no pipe's EOF and answer no signal but SIGKILL. Killed afterwards
    if it is still there, so that a failing test leaves nothing behind."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_hung_codec_process_dies_with_a_killed_server(serve: type[Served]) -> None:
    server = serve()
    [codec] = server.children()
    with stopped(codec):
        server.proc.kill()  # no chance to stop its children
        server.proc.wait(10)
        assert gone(codec)


def test_a_hung_codec_process_dies_with_a_server_whose_engine_died(serve: type[Served], tmp_path: Path) -> None:
    """--codec-timeout is the engine's: the log names the timeout it gave up after. Without --log-input (even at
    --log-level info) the request's text is not in the log."""
    log = tmp_path / "serve.log"
    server = serve("--codec-timeout", "1", "--log-level", "info", log=log)
    [codec] = server.children()
    with stopped(codec):
        with contextlib.suppress(httpx.TransportError):  # the decode times out: the engine is dead
            httpx.post(server.url + "/v1/audio/speech", json=speech(input="Nobody logs this."), timeout=30)
        assert server.proc.wait(30) == 3  # os._exit: the engine's stop (which would kill the codec) never runs
        assert gone(codec)
    text = log.read_text()
    assert "the codec decode took longer than 1 s" in text and "Nobody logs this." not in text


def test_serve_flags_cors_log_input_api_key_from_the_environment_and_a_model_directory(
    serve: type[Served], tiny_dir: Path, tmp_path: Path,
) -> None:
    """One `talkstream serve` with the README's flags: --model PATH (served under the directory's name),
    --cors-origins, --log-input, and TALKSTREAM_API_KEY from the environment."""
    model = tmp_path / "My-Checkpoint"
    model.symlink_to(tiny_dir, target_is_directory=True)
    log = tmp_path / "serve.log"
    server = serve("--model", str(model), "--cors-origins", "https://a.example,https://b.example", "--log-input",
                   "--log-level", "info", env={"TALKSTREAM_API_KEY": "env-key"}, log=log)
    auth = {"Authorization": "Bearer env-key"}
    assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401
    models = httpx.get(server.url + "/v1/models", headers=auth, timeout=10).json()["data"]
    assert models[0]["id"] == "My-Checkpoint"
    secret = "A sentence only the log should repeat."
    spoken = httpx.post(server.url + "/v1/audio/speech", headers=auth, timeout=60, json={
        "model": "My-Checkpoint", "input": secret, "voice": "alloy", "response_format": "pcm"})
    assert spoken.status_code == 200 and len(spoken.content) > 0
    unknown = httpx.post(server.url + "/v1/audio/speech", headers=auth, timeout=10,
                         json={"model": "tiny", "input": "Hi.", "voice": "alloy"})
    assert unknown.status_code == 404  # "tiny" is not what this server serves
    for origin, allowed in (("https://b.example", True), ("https://c.example", False)):
        preflight = httpx.options(server.url + "/v1/audio/speech", timeout=10, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert (preflight.headers.get("access-control-allow-origin") == origin) is allowed
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0
    assert secret in log.read_text()


def test_serve_raises_the_open_file_limit(serve: type[Served]) -> None:
    server = serve(soft_nofile=256)
    limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
    soft, hard = re.search(r"Max open files\s+(\d+)\s+(\d+)", limits).groups()  # type: ignore[union-attr]
    assert int(hard) > 256 and soft == hard


def reference_b64(i: int) -> str:
    """The fixture's recording as a WAV, quieter by a step for each `i`: another reference each time."""
    wav, rate = sf.read(str(VOICE_REF), dtype="float32")
    out = io.BytesIO()
    sf.write(out, wav * (1.0 - i / 64), rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(out.getvalue()).decode()


def speak_as(server: Served, i: int) -> httpx.Response:
    """A one-off clone of reference `i`, then a few frames of speech with it."""
    return httpx.post(server.url + "/v1/audio/speech", timeout=120, json={
        "model": "tts-1", "input": "Hi.", "ref_audio": reference_b64(i), "response_format": "pcm"})


def serve_base(serve: type[Served], *flags: str) -> tuple[Served, int]:
    """A server of the Base fixture that has cloned a voice, and its voice process."""
    server = serve("--model", str(OFFICIAL_BASE), *flags, env={"TALKSTREAM_MAX_FRAMES": "12"})
    assert speak_as(server, 0).status_code == 200
    [voice] = [pid for pid in server.children() if "engine.voices.process" in cmdline(pid)]
    return server, voice


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_no_child_outlives_a_killed_server_that_cloned_a_voice(serve: type[Served]) -> None:
    """The voice process, the codec process, and no resource tracker (nothing of multiprocessing's) to outlive it."""
    server, voice = serve_base(serve)
    children = server.children()
    lines = [cmdline(pid) for pid in children]
    assert any("output_builder.codec_process" in line for line in lines) and voice in children, lines
    assert not any("multiprocessing" in line for line in lines), lines  # its resource tracker, or a pool's worker
    server.proc.kill()
    server.proc.wait(10)
    assert [pid for pid in children if not gone(pid)] == []


def test_no_child_outlives_a_server_whose_engine_died(serve: type[Served]) -> None:
    server, voice = serve_base(serve)
    [codec] = [pid for pid in server.children() if "output_builder.codec_process" in cmdline(pid)]
    os.kill(codec, signal.SIGKILL)  # the engine is dead: the server exits 3 with os._exit, stopping nothing
    assert server.proc.wait(30) == 3
    assert gone(voice)


def test_a_full_clone_queue_is_429_with_retry_after(serve: type[Served]) -> None:
    """--max-queue 1: one clone being encoded (held: its voice process stopped), one waiting, the next refused."""
    server, voice = serve_base(serve, "--max-queue", "1")
    results: dict[int, int] = {}

    def speak_in_background(i: int) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.__setitem__(i, speak_as(server, i).status_code))
        thread.start()
        return thread

    os.kill(voice, signal.SIGSTOP)
    try:
        threads = []
        for i in (1, 2):
            threads.append(speak_in_background(i))
            wait_for(lambda i=i: scrape(server.url)["talkstream_clone_jobs"] == i, 30)  # type: ignore[misc]
        refused = speak_as(server, 3)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "server_busy"
    finally:
        os.kill(voice, signal.SIGCONT)
    for thread in threads:
        thread.join(120)
    assert results == {1: 200, 2: 200}
    assert scrape(server.url)["talkstream_clone_jobs"] == 0

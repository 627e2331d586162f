"""Checkpoints by Hugging Face Hub id, through `huggingface_hub`, from a Hub mirror served on 127.0.0.1 by the test
(`HF_ENDPOINT`): the download lands in the standard cache, a second start asks the mirror nothing (also with the
mirror gone and offline mode off), and every failure is one line that says what is wrong."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.aligner.korean import WORDLIST
from tests.conftest import OFFICIAL_ALIGNER, OFFICIAL_TINY

REPO = "qwen-test/tiny-cv"
SHA = "0123456789abcdef0123456789abcdef01234567"


class Mirror:
    """The few Hub endpoints `snapshot_download` calls: repository info, the file tree, and each file."""

    def __init__(self, root: Path) -> None:
        self.files = {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}
        self.requests: list[str] = []
        app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "HEAD"])])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def handle(self, request: Request) -> Response:
        path = request.path_params["path"]
        self.requests.append(f"{request.method} /{path}")
        api = f"api/models/{REPO}/"
        if path.startswith(api + "revision/"):
            if path.removeprefix(api + "revision/") not in ("main", SHA):
                return _error(404, "RevisionNotFound")
            return JSONResponse({"id": REPO, "sha": SHA, "siblings": [{"rfilename": f} for f in self.files]})
        if path.startswith(api + "tree/"):
            return JSONResponse([{"type": "file", "path": f, "size": p.stat().st_size, "oid": _oid(p)}
                                 for f, p in self.files.items()])
        prefix = f"{REPO}/resolve/"
        if path.startswith(prefix):
            name = path.removeprefix(prefix).split("/", 1)[1]
            data = self.files[name].read_bytes() if name in self.files else None
            if data is None:
                return _error(404, "EntryNotFound")
            headers = {"X-Repo-Commit": SHA, "ETag": f'"{_oid(self.files[name])}"', "Content-Length": str(len(data))}
            return Response(b"" if request.method == "HEAD" else data, headers=headers)
        if path.startswith("api/models/gated/"):
            return _error(403, "GatedRepo")
        return _error(404, "RepoNotFound")


def _error(status: int, code: str) -> Response:
    return JSONResponse({"error": code}, status_code=status, headers={"X-Error-Code": code})


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    m = Mirror(OFFICIAL_TINY)
    yield m
    m.stop()


def talkstream(*args: str, home: Path, endpoint: str, offline: bool = False,
               module: bool = True) -> subprocess.CompletedProcess[str]:
    """`talkstream ARGS` (or `python ARGS`) with this Hub cache and endpoint."""
    env = {**os.environ, "HF_HOME": str(home), "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "1" if offline else "0",
           "HF_HUB_DISABLE_XET": "1"}
    env.pop("HF_HUB_CACHE", None)
    command = [sys.executable, "-m", "server.cli", *args] if module else [sys.executable, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=120)


def test_download_lands_in_the_cache_and_a_second_start_asks_nothing(mirror: Mirror, tmp_path: Path) -> None:
    done = talkstream("download", REPO, home=tmp_path, endpoint=mirror.url)
    assert done.returncode == 0, done.stderr
    snapshot = Path(done.stdout.strip())
    assert snapshot == tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / SHA
    for name, source in mirror.files.items():
        assert (snapshot / name).read_bytes() == source.read_bytes()
    assert "100%" in done.stderr  # huggingface_hub's progress bars
    mirror.requests.clear()
    again = talkstream("-c", f"from talker.models.hub import resolve; print(resolve({REPO!r}))", home=tmp_path,
                       endpoint=mirror.url, module=False)
    assert again.returncode == 0 and Path(again.stdout.strip()) == snapshot  # what `serve` and the engine call
    assert mirror.requests == []


def test_downloading_an_aligner_also_keeps_the_korean_word_list(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A forced aligner is a checkpoint `download` takes too; the official Korean word list it needs comes from the
    official wheel on PyPI into the server's cache, so that a server started offline has it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the server's cache: $XDG_CACHE_HOME/talkstream
    aligner = Mirror(OFFICIAL_ALIGNER)
    try:
        done = talkstream("download", REPO, home=tmp_path, endpoint=aligner.url)
    finally:
        aligner.stop()
    assert done.returncode == 0, done.stderr
    assert (Path(done.stdout.strip()) / "preprocessor_config.json").is_file()
    [wordlist] = (tmp_path / "xdg" / "talkstream").rglob(WORDLIST)
    assert len(wordlist.read_text(encoding="utf-8").splitlines()) > 10_000


def test_a_cached_model_serves_with_the_hub_unreachable_and_under_its_id(mirror: Mirror, tmp_path: Path) -> None:
    assert talkstream("download", REPO, home=tmp_path, endpoint=mirror.url).returncode == 0
    mirror.stop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_ENDPOINT": mirror.url, "HF_HUB_OFFLINE": "0",
           "TALKSTREAM_CACHE_DIR": str(tmp_path / "ts")}
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--model", REPO, "--port", str(port),
                             "--log-level", "warning"], env=env)
    try:
        import httpx

        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]
        assert models[0]["id"] == REPO
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", timeout=60,
                          json={"model": REPO, "input": "hello world", "voice": "ryan", "response_format": "pcm"})
        assert resp.status_code == 200 and len(resp.content) > 0
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize(("model", "revision", "offline", "says"), [
    ("nobody/nothing", None, False, "no such repository"),
    ("gated/model", None, False, "access is restricted"),
    (REPO, "v9", False, "has no revision 'v9'"),
    (REPO, None, True, "is not in the cache"),
    ("not a repo id!", None, False, "neither a checkpoint directory nor"),
])
def test_each_failure_is_one_clear_line(mirror: Mirror, tmp_path: Path, model: str, revision: str | None,
                                        offline: bool, says: str) -> None:
    args = ["serve", "--model", model, "--port", "1"] + (["--revision", revision] if revision else [])
    done = talkstream(*args, home=tmp_path, endpoint=mirror.url, offline=offline)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("talkstream: error:")]
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_directory_that_is_not_a_checkpoint_says_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    done = talkstream("serve", "--model", str(tmp_path), home=tmp_path, endpoint="http://127.0.0.1:9")
    assert done.returncode == 2 and "is not a Qwen3-TTS checkpoint: missing" in done.stderr
    missing = done.stderr.strip().split("missing ", 1)[1].split(", ")
    assert "config.json" not in missing and {"model.safetensors", "speech_tokenizer/config.json"} <= set(missing)

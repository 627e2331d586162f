"""Fixtures shared by the output-side test modules: the codecs, and a started engine on the tiny model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from output_builder.codecs import Qwen12HzCodec
from output_builder.codecs.native import NativeKernels, load_native
from output_builder.engine import Engine
from talker.config import EngineConfig
from tests.conftest import OFFICIAL_TINY


@pytest.fixture(scope="module")
def official() -> Qwen12HzCodec:
    """The 12 Hz codec of the tiny checkpoint the official package wrote (tests/fixtures/official)."""
    return Qwen12HzCodec.from_pretrained(OFFICIAL_TINY / "speech_tokenizer")


@pytest.fixture(scope="session")
def native_kernels(tiny_cache: Path) -> NativeKernels:
    """The codec's compiled CPU kernels; the machines this suite runs on have a C compiler, so they must build."""
    kernels = load_native(tiny_cache)
    assert kernels is not None, "the native codec kernels did not build (see the log)"
    return kernels


@pytest.fixture
async def engine(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    e = Engine(engine_config)
    await e.start()
    yield e
    await e.stop()

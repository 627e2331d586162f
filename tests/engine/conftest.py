"""A started engine on the tiny model, for the engine's own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.config import EngineConfig
from engine.engine import Engine


@pytest.fixture
async def engine(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    e = Engine(engine_config)
    await e.start()
    yield e
    await e.stop()

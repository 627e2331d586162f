"""A started engine on the tiny model, for the engine's own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from output_builder.assembler import RequestOutput


@pytest.fixture
async def engine(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    e = Engine(engine_config)
    await e.start()
    yield e
    await e.stop()


def output(engine: Engine, request_id: str) -> RequestOutput:
    """A live request's output (engine/live.py)."""
    live = engine.live.get(request_id)
    assert live is not None, f"{request_id} is not live"
    return live.output

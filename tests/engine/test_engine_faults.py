"""Faults, backpressure and slow readers: only the affected requests fail, nothing leaks, nothing hangs."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from common.request import EngineDeadError, EngineState, FinishReason, RequestFailedError, SpeechRequest
from engine.config import EngineConfig
from engine.engine import Engine
from talker.scheduler import SeqStatus

from .test_engine import TEXT, assert_idle, collect, wait_until


def fail_once(stage: str):  # type: ignore[no-untyped-def]
    state = {"armed": True}

    def hook(where: str, _batch: object) -> None:
        if where == stage and state["armed"]:
            state["armed"] = False
            raise RuntimeError(f"injected {stage} fault")

    return hook


@pytest.mark.parametrize("stage", ["step", "code_predictor"])
async def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(engine: Engine, stage: str) -> None:
    assert engine.worker is not None
    engine.worker.fault_hook = fail_once(stage)
    victims = engine.submit_many([SpeechRequest(text=TEXT, seed=i) for i in range(2)])
    for v in victims:
        with pytest.raises(RequestFailedError, match=f"injected {stage} fault"):
            await collect(v)
        assert v.finish_reason is FinishReason.ERROR
    survivor = engine.submit(SpeechRequest(text=TEXT, seed=5))
    assert (await collect(survivor)).size > 0
    assert engine.state is EngineState.READY
    await wait_until(lambda: engine.stats()["slots_in_use"] == 0)
    assert_idle(engine)


async def test_repeated_step_failures_mark_the_engine_dead(engine: Engine) -> None:
    assert engine.worker is not None

    def always(where: str, _batch: object) -> None:
        raise RuntimeError("device is gone")

    engine.worker.fault_hook = always
    for i in range(5):
        if engine.state is EngineState.DEAD:
            break
        stream = engine.submit(SpeechRequest(text=TEXT, seed=i))
        with pytest.raises((RequestFailedError, EngineDeadError)):
            await asyncio.wait_for(collect(stream), 10)
    await wait_until(lambda: engine.state is EngineState.DEAD)
    with pytest.raises(EngineDeadError, match="dead"):
        engine.submit(SpeechRequest(text=TEXT))


async def test_a_codec_failure_fails_only_that_batch(engine: Engine) -> None:
    assert engine.pipeline is not None
    engine.pipeline.decoder.fault_hook = fail_once("codec")
    victim = engine.submit(SpeechRequest(text=TEXT, seed=1))
    with pytest.raises(RequestFailedError, match="audio decoding failed"):
        await collect(victim)
    survivor = engine.submit(SpeechRequest(text=TEXT, seed=2))
    assert (await collect(survivor)).size > 0
    await wait_until(lambda: engine.stats()["slots_in_use"] == 0)
    assert_idle(engine)


async def test_a_reader_that_falls_behind_pauses_its_request(engine_config: EngineConfig) -> None:
    e = Engine(dataclasses.replace(engine_config, max_ahead_s=0.5))
    await e.start()
    try:
        slow = e.submit(SpeechRequest(text=TEXT * 6, seed=1, max_frames=200))
        assert e.worker is not None
        by_id = e.worker.scheduler.by_id
        await wait_until(lambda: slow.request_id in by_id)
        seq = by_id[slow.request_id]
        await wait_until(lambda: seq.status is SeqStatus.PAUSED)
        assert slow.buffered_seconds < 2.0  # bounded: paused just past max_ahead_s
        other = e.submit(SpeechRequest(text=TEXT, seed=2))
        assert (await collect(other)).size > 0
        audio = await collect(slow)
        assert slow.finish_reason in (FinishReason.EOS, FinishReason.MAX_FRAMES) and audio.size > 0
    finally:
        await e.stop()


async def test_an_idle_reader_is_dropped_and_its_slot_freed(engine_config: EngineConfig) -> None:
    e = Engine(dataclasses.replace(engine_config, max_ahead_s=0.5, reader_timeout_s=0.5))
    await e.start()
    try:
        idle = e.submit(SpeechRequest(text=TEXT * 6, seed=1, max_frames=200))
        await wait_until(lambda: idle.done, timeout=30)
        with pytest.raises(RequestFailedError, match="stopped reading"):
            await collect(idle)
        await wait_until(lambda: e.stats()["slots_in_use"] == 0)
        assert_idle(e)
    finally:
        await e.stop()


async def test_any_mix_of_cancels_and_failures_leaves_nothing_behind(engine: Engine) -> None:
    assert engine.worker is not None
    engine.worker.fault_hook = fail_once("step")
    first = engine.submit_many([SpeechRequest(text=TEXT, seed=i) for i in range(3)])
    failed = await asyncio.gather(*(collect(s) for s in first), return_exceptions=True)
    assert all(isinstance(r, RequestFailedError) for r in failed)
    rest = [engine.submit(SpeechRequest(text=TEXT * 3, seed=10 + i)) for i in range(5)]
    rest[0].cancel()
    await rest[1].__anext__()
    rest[1].cancel()
    done = await asyncio.gather(*(collect(s) for s in rest[2:]))
    assert all(a.size > 0 for a in done)
    await wait_until(lambda: engine.stats()["slots_in_use"] == 0)
    assert_idle(engine)

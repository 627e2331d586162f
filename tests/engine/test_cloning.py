"""The clone queue through a real Base engine and its voice process: bounded per kind (EngineBusyError with a
Retry-After when full), one-off clones and creations served in turn, a caller that goes stops its queued clone,
and a reference already seen comes from the cache (counted by the voice process itself). The voice process is held
with SIGSTOP so that clones pile up deterministically; the queue's own count says when they have."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from common.request import ClonePrompt, EngineBusyError, EngineDeadError
from engine.config import EngineConfig
from engine.engine import Engine
from engine.voices.process import VoiceProcess
from tests.conftest import OFFICIAL_BASE, VOICE_REF, VOICE_REF_TEXT

WAITING = 2  # the engine's max_queue: clones of each kind that may wait beside the one being encoded


@pytest.fixture
async def base(engine_config: EngineConfig) -> AsyncIterator[Engine]:
    e = Engine(replace(engine_config, model=str(OFFICIAL_BASE), max_queue=WAITING))
    await e.start()
    yield e
    await e.stop()


def reference(i: int = 0) -> np.ndarray:
    """The fixture's recording, made a different reference for each `i` (quieter by a step)."""
    wav, _ = sf.read(str(VOICE_REF), dtype="float32")
    return np.asarray(wav * (1.0 - i / 64), np.float32)


def voice_process(engine: Engine) -> VoiceProcess:
    assert engine._loaded is not None and engine._loaded.voice_encoder is not None
    return engine._loaded.voice_encoder


@contextlib.contextmanager
def held(engine: Engine) -> Iterator[None]:
    """The voice process is stopped: the clone it was sent waits, and every later one queues."""
    pid = voice_process(engine).pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def until(check: Callable[[], bool]) -> None:
    """A condition on the engine's state, polled (bounded by the test's timeout)."""
    while not check():
        await asyncio.sleep(0.005)


def waiters(engine: Engine) -> int:
    """Callers waiting on the queue's clones."""
    assert engine._cloning is not None
    return sum(job.waiters for job in engine._cloning._jobs.values())


async def prompts(engine: Engine) -> int:
    """Encoder runs so far, as the voice process counts them."""
    return (await asyncio.to_thread(voice_process(engine).stats))["prompts"]


async def queued(engine: Engine, call: Awaitable[ClonePrompt], jobs: int) -> asyncio.Task[ClonePrompt]:
    """`call` as a task, once the engine counts it among its clones."""
    task = asyncio.ensure_future(call)
    await until(lambda: engine.stats()["clone_jobs"] == jobs or task.done())
    return task


async def test_a_creation_waits_behind_one_one_off_clone_not_behind_all_of_them(
    engine_config: EngineConfig,
) -> None:
    engine = Engine(replace(engine_config, model=str(OFFICIAL_BASE), max_queue=8))
    await engine.start()
    try:
        await engine.clone_prompt(reference(), None, kind="one_off")  # the voice process is up, encoders loaded
        finished: list[str] = []

        async def clone(name: str, i: int, kind: str) -> ClonePrompt:
            prompt = await engine.clone_prompt(reference(i), None, kind=kind)  # type: ignore[arg-type]
            finished.append(name)
            return prompt

        with held(engine):
            tasks = [await queued(engine, clone(f"one-off {i}", i, "one_off"), i) for i in range(1, 7)]
            tasks.append(await queued(engine, clone("creation", 7, "creation"), 7))
        await asyncio.gather(*tasks)
        assert finished == ["one-off 1", "creation", *(f"one-off {i}" for i in range(2, 7))]
    finally:
        await engine.stop()


async def test_a_full_queue_is_busy_for_its_kind_only_and_says_when_to_retry(base: Engine) -> None:
    await base.clone_prompt(reference(), None)
    with held(base):
        first = await queued(base, base.clone_prompt(reference(1), None, kind="one_off"), 1)  # being encoded
        waiting = [await queued(base, base.clone_prompt(reference(i), None, kind="one_off"), i) for i in (2, 3)]
        with pytest.raises(EngineBusyError, match="one-off voice clones") as busy:
            await base.clone_prompt(reference(4), None, kind="one_off")
        assert busy.value.retry_after_s >= 1.0
        creations = [await queued(base, base.clone_prompt(reference(i), None), i) for i in (4, 5)]
        with pytest.raises(EngineBusyError, match="voice creations"):
            await base.clone_prompt(reference(6), None)
        assert base.stats()["clone_jobs"] == 5
        again = await base.clone_prompt(reference(), None, kind="one_off")  # from the cache: full queues or not
    results = await asyncio.gather(first, *waiting, *creations)
    assert all(isinstance(p, ClonePrompt) for p in results) and isinstance(again, ClonePrompt)
    assert base.stats()["clone_jobs"] == 0


async def test_the_same_reference_runs_the_encoders_once(base: Engine) -> None:
    wav = reference()
    first = await base.clone_prompt(wav, VOICE_REF_TEXT)
    runs = await prompts(base)
    assert runs == 1
    assert await base.clone_prompt(wav.copy(), VOICE_REF_TEXT, kind="one_off") == first  # cached
    assert await prompts(base) == runs
    x_only = await base.clone_prompt(wav, None)  # another reference: no transcript
    assert x_only.ref_codes is None and x_only.x_vector == first.x_vector
    assert await prompts(base) == runs + 1
    with held(base):  # asked for twice while it waits: one run for both
        running = await queued(base, base.clone_prompt(reference(1), None), 1)
        twice = [asyncio.ensure_future(base.clone_prompt(reference(2), None, kind=k)) for k in ("one_off", "creation")]
        await until(lambda: waiters(base) == 3)  # one for the clone being encoded, two for the queued one
        assert base.stats()["clone_jobs"] == 2
    await running
    a, b = await asyncio.gather(*twice)
    assert a == b and await prompts(base) == runs + 3


async def test_a_queued_clone_whose_caller_goes_is_dropped(base: Engine) -> None:
    await base.clone_prompt(reference(), None)
    runs = await prompts(base)
    with held(base):
        running = await queued(base, base.clone_prompt(reference(1), None), 1)
        gone = await queued(base, base.clone_prompt(reference(2), None), 2)
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        assert base.stats()["clone_jobs"] == 1
    await running
    assert await prompts(base) == runs + 1


async def test_queued_clones_fail_when_the_engine_stops(engine_config: EngineConfig) -> None:
    engine = Engine(replace(engine_config, model=str(OFFICIAL_BASE), max_queue=WAITING))
    await engine.start()
    await engine.clone_prompt(reference(), None)
    process = voice_process(engine)
    with held(engine):
        running = await queued(engine, engine.clone_prompt(reference(1), None), 1)
        waiting = await queued(engine, engine.clone_prompt(reference(2), None), 2)
        stopping = asyncio.ensure_future(engine.stop())
        with pytest.raises(EngineDeadError):
            await waiting
    await stopping
    assert isinstance(await running, ClonePrompt)  # the clone being encoded finished first
    assert process.pid is None

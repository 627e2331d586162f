"""The engine end to end on the tiny model: real worker thread, real codec, real streams."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time

import numpy as np
import pytest

from common.request import EngineBusyError, EngineDeadError, EngineState, FinishReason, RequestError, SpeechRequest
from engine.config import EngineConfig, OutputMode
from engine.engine import Engine
from output_builder.streams import AudioStream

TEXT = "Hello world, this is a tiny test of the streaming engine."



async def collect(stream: AudioStream) -> np.ndarray:
    chunks = [c async for c in stream]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


async def wait_until(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def assert_idle(e: Engine) -> None:
    stats = e.stats()
    assert stats["active_requests"] == 0 and stats["slots_in_use"] == 0 and stats["queued_requests"] == 0


async def test_streams_end_at_eos_with_whole_frames(engine: Engine) -> None:
    streams = engine.submit_many([SpeechRequest(text=TEXT, seed=i, voice="alloy") for i in range(4)])
    audio = await asyncio.gather(*(collect(s) for s in streams))
    for s, a in zip(streams, audio, strict=True):
        assert s.finish_reason is FinishReason.EOS
        assert a.dtype == np.int16 and a.size == s.usage.frames * 1920 > 0
        assert s.time_to_first_audio is not None
    await wait_until(lambda: engine.stats()["slots_in_use"] == 0)
    assert_idle(engine)


async def test_max_frames_ends_the_stream(engine: Engine) -> None:
    stream = engine.submit(SpeechRequest(text=TEXT, seed=1, max_frames=5))
    audio = await collect(stream)
    assert stream.finish_reason is FinishReason.MAX_FRAMES and audio.size == 5 * 1920


@pytest.mark.bitexact
async def test_async_and_sync_modes_give_identical_audio(engine_config: EngineConfig) -> None:
    requests = [SpeechRequest(text=f"{TEXT} Number {i}.", seed=100 + i, voice=v)
                for i, v in enumerate(["aria", "ben", "alloy", "nova"])]
    results = {}
    for mode in (OutputMode.ASYNC, OutputMode.SYNC):
        e = Engine(dataclasses.replace(engine_config, output_mode=mode))
        await e.start()
        fresh = [dataclasses.replace(r, request_id=f"{mode}-{i}") for i, r in enumerate(requests)]
        results[mode] = await asyncio.gather(*(collect(s) for s in e.submit_many(fresh)))
        await e.stop()
    for a, b in zip(results[OutputMode.ASYNC], results[OutputMode.SYNC], strict=True):
        assert a.size > 0 and a.tobytes() == b.tobytes()


async def test_an_int8_engine_speaks_reproducibly_and_not_as_full_precision(engine_config: EngineConfig) -> None:
    """`--quantize int8` end to end: the same seeds give the same audio (in both output modes, as any engine), and the
    weights really changed (the audio is not the full-precision one)."""
    if engine_config.device != "cpu":
        pytest.skip("this checks the CPU kernel; scripts/gpu_check covers CUDA")
    requests = [SpeechRequest(text=f"{TEXT} Number {i}.", seed=7 + i) for i in range(3)]
    results = {}
    for name, cfg in (("int8-async", dataclasses.replace(engine_config, quantize="int8")),
                      ("int8-sync", dataclasses.replace(engine_config, quantize="int8", output_mode=OutputMode.SYNC)),
                      ("full", engine_config)):
        e = Engine(cfg)
        await e.start()
        fresh = [dataclasses.replace(r, request_id=f"{name}-{i}") for i, r in enumerate(requests)]
        results[name] = await asyncio.gather(*(collect(s) for s in e.submit_many(fresh)))
        await e.stop()
    for a, b, full in zip(results["int8-async"], results["int8-sync"], results["full"], strict=True):
        assert a.size > 0 and a.tobytes() == b.tobytes()
        assert a.tobytes() != full.tobytes()


@pytest.mark.bitexact
async def test_native_codec_kernels_and_torch_give_the_same_audio(engine_config: EngineConfig) -> None:
    """The engine with its compiled kernels (codec and sampler) and without: the same codes, PCM within 1 LSB.
    Greedy, since the samplers walk their candidates in different orders (same distribution, other tokens)."""
    if engine_config.device != "cpu":
        pytest.skip("the native kernels are CPU-only")
    requests = [SpeechRequest(text=f"{TEXT} Number {i}.", temperature=0.0) for i in range(3)]
    results = {}
    for native in (True, False):
        e = Engine(engine_config.tuned(native_kernels=native))
        await e.start()
        assert e.native_kernels is native
        fresh = [dataclasses.replace(r, request_id=f"{native}-{i}") for i, r in enumerate(requests)]
        results[native] = await asyncio.gather(*(collect(s) for s in e.submit_many(fresh)))
        await e.stop()
    for a, b in zip(results[True], results[False], strict=True):
        assert a.size > 0 and a.shape == b.shape
        assert np.abs(a.astype(np.int32) - b.astype(np.int32)).max() <= 1


@pytest.mark.bitexact
async def test_same_seed_same_audio_different_seed_different_audio(engine: Engine) -> None:
    a = await collect(engine.submit(SpeechRequest(text=TEXT, seed=7)))
    b = await collect(engine.submit(SpeechRequest(text=TEXT, seed=7)))
    c = await collect(engine.submit(SpeechRequest(text=TEXT, seed=8)))
    assert a.tobytes() == b.tobytes() and a.tobytes() != c.tobytes()


async def test_cancel_frees_the_slot_within_a_step(engine: Engine) -> None:
    stream = engine.submit(SpeechRequest(text=TEXT * 8, seed=3, max_frames=1000))
    await stream.__anext__()
    await wait_until(lambda: stream.buffered_seconds > 0)  # audio waits unread: the cancel must drop it
    assert engine.worker is not None
    steps_before = engine.worker.timings.total_steps
    stream.cancel()
    stream.cancel()
    await wait_until(lambda: engine.stats()["slots_in_use"] == 0)
    assert engine.worker.timings.total_steps - steps_before <= 2
    assert stream.finish_reason is FinishReason.CANCELLED
    assert (await collect(stream)).size == 0  # nothing after a cancel: audio buffered or decoded later is dropped
    assert_idle(engine)


async def test_cancelling_a_finished_request_is_harmless(engine: Engine) -> None:
    stream = engine.submit(SpeechRequest(text="Hi.", seed=3))
    await collect(stream)
    stream.cancel()
    assert stream.finish_reason is FinishReason.EOS
    assert_idle(engine)


async def test_bad_input_fails_before_engine_work(engine: Engine) -> None:
    assert engine.worker is not None
    steps = engine.worker.timings.total_steps
    for bad in (SpeechRequest(text=""), SpeechRequest(text="hi", voice="nobody"),
                SpeechRequest(text="hi", temperature=-1.0), SpeechRequest(text="x" * 5000)):
        with pytest.raises(RequestError):
            engine.submit(bad)
    # submit hands a request to the worker synchronously: nothing was sent, so no step can come of it
    assert engine.worker.inbox.empty() and not engine.live.outputs()
    assert engine.worker.timings.total_steps == steps
    assert_idle(engine)


async def test_a_generation_is_capped_at_half_of_max_len(engine_config: EngineConfig) -> None:
    """The README's MAX_FRAMES: "capped at half of MAX_LEN" (the other half holds the prompt)."""
    e = Engine(dataclasses.replace(engine_config, max_len=96, max_frames=1024))
    await e.start()
    try:
        assert e._loaded is not None and e._loaded.frontend.max_frames == 48
        stream = e.submit(SpeechRequest(text=TEXT, seed=1, temperature=0.0))
        audio = await collect(stream)
        assert stream.finish_reason is FinishReason.EOS and audio.size == stream.usage.frames * 1920 > 0
    finally:
        await e.stop()


async def test_full_engine_refuses_with_busy(engine_config: EngineConfig) -> None:
    e = Engine(dataclasses.replace(engine_config, max_batch=1, max_queue=1))
    await e.start()
    try:
        keep = e.submit_many([SpeechRequest(text=TEXT * 4, seed=i) for i in range(2)])
        with pytest.raises(EngineBusyError):
            e.submit(SpeechRequest(text=TEXT))
        for s in keep:
            s.cancel()
    finally:
        await e.stop()


async def test_submit_before_start_and_after_stop_is_refused(engine_config: EngineConfig) -> None:
    e = Engine(engine_config)
    with pytest.raises(EngineDeadError):
        e.submit(SpeechRequest(text=TEXT))
    await e.start()
    await e.stop()
    assert e.state is EngineState.STOPPED
    with pytest.raises(EngineDeadError):
        e.submit(SpeechRequest(text=TEXT))


def test_a_first_chunk_is_due_only_for_an_open_request_with_a_slot_and_no_chunk() -> None:
    from output_builder.assembler import RequestOutput

    e = Engine(EngineConfig(max_batch=3).tuned(warmup=False))

    def out(rid: str) -> RequestOutput:
        stream = AudioStream(rid, 24000, 8.0, lambda r: None, lambda r, p: None)
        o = RequestOutput(rid, stream, 100, 99, 1, 8)
        e.live.add(o)
        return o

    assert not e._first_due()
    a = out("a")
    assert e._first_due()  # submitted, no chunk yet
    a.chunks = 1
    assert not e._first_due()
    b = out("b")
    b.abandon()  # cancelled before its first chunk
    assert not e._first_due()
    out("c")
    assert e._first_due()
    out("d")  # more requests than slots: some wait in the queue, so no hold
    assert not e._first_due()


async def test_the_talker_thread_and_the_codec_process_run_nicer_than_the_server(
    engine_config: EngineConfig,
) -> None:
    e = Engine(engine_config.tuned(worker_nice=3))
    await e.start()
    try:
        await collect(e.submit(SpeechRequest(text=TEXT, seed=1, max_frames=4)))  # the worker is up and stepping
        assert e.worker is not None and e.worker.native_id is not None
        assert e._loaded is not None and e._loaded.codec_process is not None
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, e.worker.native_id) == min(base + 3, 19)
        assert os.getpriority(os.PRIO_PROCESS, e._loaded.codec_process.pid) == min(base + 3, 19)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the event loop's is unchanged
    finally:
        await e.stop()

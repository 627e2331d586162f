"""The output bridge: how a step's chunks become codec calls, and the async decoder's order."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from common.request import FinishReason
from output_builder.assembler import ChunkJob, RequestOutput
from output_builder.bridge import AsyncBridge
from output_builder.chunk_decoder import ChunkDecoder
from output_builder.pipeline import OutputPipeline
from output_builder.streams import AudioStream
from talker.device import HostBuffer
from talker.snapshot import Row, StepSnapshot

EOS = 99
G = 4


OUTPUTS: dict[object, RequestOutput] = {}  # every test output, by the key a Seq would carry for it


def output(rid: str, first_chunk: int = 1, chunk: int = 8) -> RequestOutput:
    stream = AudioStream(rid, 24000, 60.0, lambda r: None, lambda r, paused: None)
    out = RequestOutput(rid, stream, 1000, EOS, first_chunk, chunk)
    OUTPUTS[out.stream_id] = out
    return out


def job(out: RequestOutput, frames: int, first: bool = False) -> ChunkJob:
    return ChunkJob(out, np.zeros((G, frames), dtype=np.int64), None, first=first)


def pipeline(backend: object, batch_frames: int = 16) -> OutputPipeline:
    return OutputPipeline(ChunkDecoder(backend), lambda exc: None,  # type: ignore[arg-type]
                          lambda rid, key: OUTPUTS.get(key), batch_frames)


class Recorder:
    """A codec backend that records its calls as they end; `gate`, when set, holds the first call of the lane
    `gated` (the backlog's unless told) until released."""

    def __init__(self, gate: threading.Event | None = None, gated: bool = False) -> None:
        self.calls: list[list[int]] = []
        self.lanes: list[bool] = []
        self.gate, self.gated = gate, gated
        self._held = False

    def decode(self, jobs: list[tuple[int, np.ndarray]], urgent: bool = False,
               context: dict[int, int] | None = None, peek: set[int] | None = None) -> list[np.ndarray]:
        if self.gate is not None and urgent is self.gated and not self._held:
            self._held = True
            self.gate.wait(5.0)
        self.calls.append([sid for sid, _ in jobs])
        self.lanes.append(urgent)
        return [np.zeros(codes.shape[1] * 1920, dtype=np.int16) for _, codes in jobs]

    def close_stream(self, sid: int) -> None:
        return None


def test_first_chunks_go_in_one_urgent_call_and_the_rest_in_calls_under_the_cap() -> None:
    outs = [output(f"r{i}") for i in range(6)]
    jobs = [job(outs[0], 8), job(outs[1], 1, first=True), job(outs[2], 8), job(outs[3], 4),
            job(outs[4], 1, first=True), job(outs[5], 20)]
    calls = pipeline(Recorder()).batches(jobs)
    assert [(urgent, [j.out.request_id for j in c]) for urgent, c in calls] == [
        (True, ["r1", "r4"]), (False, ["r0", "r2"]), (False, ["r3"]), (False, ["r5"]),  # r5 alone: over the cap
    ]


def test_a_final_chunk_without_frames_counts_nothing() -> None:
    out = output("r")
    empty = ChunkJob(out, None, None)
    assert empty.frames == 0 and job(out, 3).frames == 3
    calls = pipeline(Recorder(), batch_frames=8).batches([job(output("a"), 8), empty])
    assert [len(c) for _, c in calls] == [2]


def test_a_call_fills_the_cap_exactly_after_a_split() -> None:
    outs = [output(f"r{i}") for i in range(3)]
    calls = pipeline(Recorder(), batch_frames=8).batches([job(outs[0], 8), job(outs[1], 4), job(outs[2], 4)])
    assert [[j.out.request_id for j in c] for _, c in calls] == [["r0"], ["r1", "r2"]]


class Closes(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.closed: list[int] = []

    def close_stream(self, sid: int) -> None:
        self.closed.append(sid)


def test_the_decoder_skips_ended_streams_and_tracks_the_codec_state_it_holds() -> None:
    """A chunk of a stream that has ended (cancelled) is not decoded and opens no codec state; a final chunk with
    no frames makes no codec call; `open_streams` (the leak gauge) holds exactly the streams with state."""
    backend = Closes()
    decoder = ChunkDecoder(backend)  # type: ignore[arg-type]
    live, gone = output("live"), output("gone")
    gone.stream.cancel()
    pcm = decoder.decode([job(live, 2), job(gone, 2), ChunkJob(live, None, None)])
    assert backend.calls == [[live.stream_id]]
    assert pcm[0] is not None and pcm[0].size == 2 * 1920 and pcm[1] is None and pcm[2] is None
    assert decoder.open_streams == {live.stream_id}
    assert decoder.decode([ChunkJob(live, None, None)]) == [None] and len(backend.calls) == 1
    decoder.release(live)
    decoder.release(live)  # once only
    assert decoder.open_streams == set() and backend.closed == [live.stream_id]


def test_delivery_counts_frames_puts_audio_and_ends_the_stream_on_its_final_chunk() -> None:
    backend = Closes()
    pipe = pipeline(backend)
    out = output("r")
    pipe.decoder.decode([job(out, 1)])  # the stream now holds codec state
    first, last = job(out, 1, first=True), ChunkJob(out, np.zeros((G, 2), dtype=np.int64), FinishReason.EOS)
    pipe.deliver([first], [np.ones(1920, dtype=np.int16)])
    assert (out.stream.usage.frames, out.stream.usage.samples, out.stream.done) == (1, 1920, False)
    pipe.deliver([last, ChunkJob(output("other"), None, None)], [np.ones(2 * 1920, dtype=np.int16), None])
    assert (out.stream.usage.frames, out.stream.usage.samples) == (3, 3 * 1920)
    assert out.stream.finish_reason is FinishReason.EOS and out.released and backend.closed == [out.stream_id]
    assert pipe.decoder.open_streams == set()


def test_a_stream_released_while_its_chunk_was_on_the_way_keeps_no_codec_state() -> None:
    decoder = ChunkDecoder(Closes())  # type: ignore[arg-type]
    out = output("r")
    decoder.release(out)  # on the loop, while the codec thread was about to decode its chunk
    decoder.decode([job(out, 1)])
    assert decoder.open_streams == set()


def row(out: RequestOutput) -> Row:
    return (out.request_id, out.stream_id, 0)


def snapshot(step: int, rows: list[RequestOutput]) -> StepSnapshot:
    return StepSnapshot(step, tuple(row(r) for r in rows), torch.zeros(len(rows), G, dtype=torch.int32))


def test_pending_frames_survive_the_reuse_of_a_released_host_buffer() -> None:
    # CUDA snapshots land in a ring of pinned buffers, reused once both readers release them; frames waiting for
    # their chunk must not alias that memory (they became garbage codes and a device-side assert in the codec).
    out = output("r", first_chunk=4, chunk=4)
    ring = HostBuffer(torch.zeros(G, dtype=torch.int32), in_use=True)
    jobs: list[ChunkJob] = []
    for step in range(4):
        ring.data.fill_(step + 1)
        snap = StepSnapshot(step, (row(out),), ring.data.view(1, G), buffer=ring)
        jobs += pipeline(Recorder()).route(snap)
    assert len(jobs) == 1 and jobs[0].codes is not None
    assert jobs[0].codes.tolist() == [[1, 2, 3, 4]] * G


async def test_a_new_requests_first_chunk_is_decoded_while_a_backlog_call_is_in_flight() -> None:
    gate = threading.Event()
    backend = Recorder(gate)
    pipe = pipeline(backend, batch_frames=2)
    pool = ThreadPoolExecutor(2)
    bridge = AsyncBridge(asyncio.get_running_loop(), pipe, pool, lambda rid: None, poll_s=0.001)
    bridge.start()
    old = [output(f"old{i}", first_chunk=2, chunk=2) for i in range(3)]
    for out in old:  # their first chunks are behind them
        out.chunks = 1
    bridge.publish(snapshot(0, old))
    bridge.publish(snapshot(1, old))  # each old request: a 2-frame chunk, one call each (the cap)
    await asyncio.wait_for(_until(lambda: pipe.jobs_in_flight == 3), 5.0)  # the first call is held at the gate
    new = output("new")
    bridge.publish(snapshot(2, [*old, new]))  # new's first chunk; the old ones only add a frame
    await asyncio.wait_for(_until(lambda: backend.calls == [[new.stream_id]]), 5.0)  # beside the held call
    assert backend.lanes == [True]
    gate.set()
    await asyncio.wait_for(_until(lambda: pipe.jobs_in_flight == 0), 5.0)
    await bridge.stop()
    pool.shutdown()
    assert backend.calls[1:] == [[old[0].stream_id], [old[1].stream_id], [old[2].stream_id]]  # in order


async def test_a_streams_later_chunk_waits_for_its_first_chunk() -> None:
    gate = threading.Event()
    backend = Recorder(gate, gated=True)  # the first chunk's call is held
    pipe = pipeline(backend)
    pool = SubmitLog(2)
    bridge = AsyncBridge(asyncio.get_running_loop(), pipe, pool, lambda rid: None, poll_s=0.001)
    bridge.start()
    new, other = output("new", first_chunk=1, chunk=1), output("other", first_chunk=1, chunk=1)
    other.chunks = 1
    bridge.publish(snapshot(0, [new]))  # new's first chunk: held
    bridge.publish(snapshot(1, [new, other]))  # new's second chunk and other's, one backlog call
    bridge.publish(snapshot(2, [other]))  # other's next chunk: behind that call, as its stream's order wants
    await asyncio.wait_for(_until(lambda: pipe.jobs_in_flight == 4), 5.0)  # all routed
    await settle()
    # the backlog call carries new's second chunk: it waits for the first, which is held
    assert pool.submitted == [[new.stream_id]]
    gate.set()
    await asyncio.wait_for(_until(lambda: pipe.jobs_in_flight == 0), 5.0)
    await bridge.stop()
    pool.shutdown()
    assert backend.calls == [[new.stream_id], [new.stream_id, other.stream_id], [other.stream_id]]
    assert backend.lanes == [True, False, False]


async def _until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0.001)


async def settle() -> None:
    """Runs every callback the event loop has ready, and those they make ready, without waiting for any time: what
    the bridge's tasks would do next on the loop has been done (a codec call it starts is submitted on the loop)."""
    for _ in range(50):
        await asyncio.sleep(0)


class SubmitLog(ThreadPoolExecutor):
    """The codec pool, recording each codec call's stream ids as the loop submits it (not when a thread runs it)."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.submitted: list[list[int]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        jobs: list[ChunkJob] = args[0]
        self.submitted.append([j.out.stream_id for j in jobs])
        return super().submit(fn, *args, **kwargs)


async def test_a_backlog_call_waits_while_a_first_chunk_is_due_and_the_first_chunk_goes_first() -> None:
    backend = Recorder()
    pipe = pipeline(backend)
    pool = SubmitLog(2)
    new = output("new")
    bridge = AsyncBridge(asyncio.get_running_loop(), pipe, pool, lambda rid: None, poll_s=0.001,
                         first_due=lambda: new.chunks == 0, hold_s=60.0)  # only the first chunk can end it
    bridge.start()
    old = output("old", first_chunk=2, chunk=2)
    old.chunks = 1
    bridge.publish(snapshot(0, [old]))
    bridge.publish(snapshot(1, [old]))  # a backlog call, held: new's first chunk is due
    await asyncio.wait_for(_until(lambda: pipe.jobs_in_flight == 1), 5.0)  # routed
    await settle()
    assert pool.submitted == []
    bridge.publish(snapshot(2, [old, new]))
    await asyncio.wait_for(_until(lambda: pipe.jobs_in_flight == 0 and len(backend.calls) == 2), 5.0)
    await bridge.stop()
    pool.shutdown()
    # the order the bridge hands calls to the codec; which of the pool's two threads then runs first is not its
    # to decide (the codec process serves the urgent call between the stages of a backlog call)
    assert pool.submitted == [[new.stream_id], [old.stream_id]]


async def test_a_first_chunk_queued_behind_a_busy_urgent_lane_still_goes_before_a_backlog_call() -> None:
    gate = threading.Event()
    backend = Recorder(gate, gated=True)  # the first urgent call is held: the next one waits in the lane's queue
    pipe = pipeline(backend)
    pool = SubmitLog(2)
    bridge = AsyncBridge(asyncio.get_running_loop(), pipe, pool, lambda rid: None, poll_s=0.001,
                         first_due=lambda: False, hold_s=60.0)  # only a first chunk not yet handed over holds
    bridge.start()
    a, b = output("a"), output("b")
    old = output("old", first_chunk=2, chunk=2)
    old.chunks = 1
    bridge.publish(snapshot(0, [a]))
    await asyncio.wait_for(_until(lambda: pool.submitted == [[a.stream_id]]), 5.0)  # held at the gate
    bridge.publish(snapshot(1, [old]))
    bridge.publish(snapshot(2, [old, b]))  # b's first chunk (queued behind a's) and old's backlog chunk
    await asyncio.wait_for(_until(lambda: pipe.jobs_in_flight == 3), 5.0)  # routed
    await settle()
    assert pool.submitted == [[a.stream_id]]
    gate.set()
    await asyncio.wait_for(_until(lambda: pipe.jobs_in_flight == 0), 5.0)
    await bridge.stop()
    pool.shutdown()
    assert pool.submitted == [[a.stream_id], [b.stream_id], [old.stream_id]]


async def test_the_hold_on_the_backlog_is_bounded() -> None:
    backend = Recorder()
    pipe = pipeline(backend)
    pool = ThreadPoolExecutor(2)
    bridge = AsyncBridge(asyncio.get_running_loop(), pipe, pool, lambda rid: None, poll_s=0.001,
                         first_due=lambda: True, hold_s=0.05)
    bridge.start()
    old = output("old", first_chunk=2, chunk=2)
    old.chunks = 1
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    bridge.publish(snapshot(0, [old]))
    bridge.publish(snapshot(1, [old]))
    await asyncio.wait_for(_until(lambda: len(backend.calls) == 1), 5.0)  # bounded: the call does start
    assert loop.time() - t0 >= 0.05  # held for hold_s first (a lower bound on the bridge's own clock: no speed)
    await bridge.stop()
    pool.shutdown()


async def test_a_step_with_first_frames_is_routed_without_waiting_for_the_poll() -> None:
    routed: list[int] = []
    pipe = pipeline(Recorder())
    pipe.tap = lambda snap, codes: routed.append(snap.step)
    pool = ThreadPoolExecutor(2)
    # a poll interval no test waits out: the step below is routed only if its publish wakes the router
    bridge = AsyncBridge(asyncio.get_running_loop(), pipe, pool, lambda rid: None, poll_s=3600.0, idle_polls=100)
    bridge.start()
    bridge.publish(snapshot(0, [output("a", first_chunk=4)]))  # wakes the parked router, which then polls
    await asyncio.wait_for(_until(lambda: routed == [0]), 5.0)
    await settle()  # the router is napping now
    first = snapshot(1, [output("b")])
    first.first_frames = True
    bridge.publish(first)
    await asyncio.wait_for(_until(lambda: routed == [0, 1]), 5.0)
    await bridge.stop()
    pool.shutdown()

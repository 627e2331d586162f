"""The Talker worker thread with the tiny model: a request that arrives while a step is in flight is prefilled
between that step's code predictor sub-steps, and the step in flight computes what it would have without it.

A row's float arithmetic is not batch-invariant on CPU (`F.linear` of a row differs between one row and several,
and attention runs to the batch's longest row), so codes are compared bit for bit only between runs with the same
sequence of batch compositions, or over the steps before the batches differ.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from common.request import SpeechRequest
from frontend.frontend import Frontend, load_tokenizer
from talker.device import DeviceLayer
from talker.models.loader import LoadedTalker, load_talker
from talker.runner import Runner
from talker.scheduler import Seq
from talker.snapshot import StepSnapshot
from talker.worker import Abort, Command, Stop, Submit, TalkerWorker

pytestmark = pytest.mark.bitexact  # bit-for-bit comparisons: scripts/test runs them under every CPU capability
CPU = torch.device("cpu")
FRAMES = {"a": 12, "b": 6}
ARRIVES_AT = 3  # b is submitted while a's 4th step is in flight


class Recorder:
    """The worker's publisher: per request, (step, codes [G]) in publication order."""

    def __init__(self, eos: int = -1, limits: dict[str, int] | None = None) -> None:
        self.eos, self.limits = eos, limits or {}
        self.ended = {rid: threading.Event() for rid in self.limits}  # set at a request's EOS frame or frame cap
        self.rows: defaultdict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
        self.order: list[tuple[int, tuple[str, ...]]] = []
        self.errors: list[BaseException] = []
        self.slots: dict[str, int] = {}

    def publish(self, snap: StepSnapshot) -> None:
        if snap.error is not None:
            self.errors.append(snap.error)
            return
        assert snap.codes is not None
        ids = tuple(rid for rid, _, _ in snap.rows)
        self.order.append((snap.step, ids))
        for row, rid in enumerate(ids):
            self.rows[rid].append((snap.step, snap.codes[row].numpy().copy()))
            if rid in self.ended and (self.rows[rid][-1][1][0] == self.eos or len(self.rows[rid]) == self.limits[rid]):
                self.ended[rid].set()
        snap.release()


@pytest.fixture(scope="module")
def loaded(tiny_dir: Path) -> LoadedTalker:
    return load_talker(tiny_dir, CPU, torch.float32)


def seq_for(loaded: LoadedTalker, tiny_dir: Path, rid: str, text: str, seed: int, frames: int | None = None) -> Seq:
    frontend = Frontend(loaded.cfg, loaded.generation, load_tokenizer(tiny_dir), 200, 256, 256)
    p = frontend.prepare(SpeechRequest(text=text, voice="aria", seed=seed, max_frames=frames or FRAMES[rid]))
    return Seq(rid, p.prompt, p.params, p.seed, p.max_frames, None)


def run(loaded: LoadedTalker, tiny_dir: Path, midstep: bool, with_b: bool = True, abort_a: bool = False,
        fail_b: bool = False, arrives_at: int = ARRIVES_AT, a_frames: int | None = None) -> Recorder:
    """a alone, then b submitted from inside a's step ARRIVES_AT (before its code predictor runs); `abort_a`: an
    abort of a arrives just before; `fail_b`: b's first step raises; `a_frames`: a's frame cap. Without mid-step
    prefill, b is prefilled at the next boundary, in a step of its own that a sits out."""
    recorder = Recorder(loaded.cfg.codec.eos, {"a": a_frames or FRAMES["a"], "b": FRAMES["b"]})
    runner = Runner(loaded.model.talker, loaded.cfg, 4, 256, 256, CPU, torch.float32)
    worker = TalkerWorker(runner, DeviceLayer(CPU), 4, recorder, loaded.cfg.codec.eos, prefill_midstep=midstep)
    a = seq_for(loaded, tiny_dir, "a", "the quick brown fox jumps over the lazy dog", 1, a_frames)
    b = seq_for(loaded, tiny_dir, "b", "a second voice joins", 2)
    steps_of_a = [0]
    submitted = threading.Event()

    def hook(where: str, batch: tuple[Seq, ...]) -> None:
        if where == "code_predictor" and batch == (a,):
            if steps_of_a[0] == arrives_at and with_b:
                arrivals: list[Command] = [Abort("a")] if abort_a else []
                for cmd in [*arrivals, Submit((b,))]:
                    worker.send(cmd)
                submitted.set()
            steps_of_a[0] += 1
        if where == "step" and batch == (b,) and fail_b:
            raise RuntimeError("injected fault in b's prefill")

    worker.fault_hook = hook
    worker.start()
    worker.send(Submit((a,)))
    # the requests that run to their end: a unless aborted, b unless its prefill fails
    ending = [rid for rid, runs in (("a", not abort_a), ("b", with_b and not fail_b)) if runs]
    try:
        if with_b:
            assert submitted.wait(30)
        for rid in ending:
            assert recorder.ended[rid].wait(60), f"{rid} did not end"
    finally:
        worker.send(Stop())
        assert worker.join(30)
    assert len(recorder.errors) == fail_b
    recorder.slots = {"a": a.slot, "b": b.slot}
    return recorder


def codes(recorder: Recorder, rid: str) -> np.ndarray:
    return np.stack([c for _, c in recorder.rows[rid]])  # [T, G]


def expected_frames(c: np.ndarray, limit: int, eos: int) -> int:
    hits = np.flatnonzero(c[:, 0] == eos)
    return int(hits[0]) + 1 if hits.size else limit


def test_a_request_arriving_mid_step_gets_its_first_frame_from_that_step(
    loaded: LoadedTalker, tiny_dir: Path
) -> None:
    eos = loaded.cfg.codec.eos
    mid, after, alone = run(loaded, tiny_dir, True), run(loaded, tiny_dir, False), run(loaded, tiny_dir, True, False)
    a_step = mid.rows["a"][ARRIVES_AT][0]
    # 1. mid-step: b's first frame is published with the step in flight, before a's frame of that step
    assert mid.rows["b"][0][0] == a_step
    assert mid.order.index((a_step, ("b",))) < mid.order.index((a_step, ("a",)))
    # 2. without it, b waits for that step to end and is prefilled in the next step
    assert after.rows["b"][0][0] == after.rows["a"][ARRIVES_AT][0] + 1
    # 3. the same codes as a boundary prefill in a step of its own (the same batches: b's prefill alone, then a and
    # b decoding together at the same frames), and each request stops at EOS or its cap
    for rid in ("a", "b"):
        assert np.array_equal(codes(mid, rid), codes(after, rid))
        c = codes(mid, rid)
        assert len(c) == expected_frames(c, FRAMES[rid], eos)
    # 4. the step in flight is undisturbed: up to and including it, a's codes are those it gets alone
    assert np.array_equal(codes(mid, "a")[: ARRIVES_AT + 1], codes(alone, "a")[: ARRIVES_AT + 1])
    # 5. a's frames keep one step each: b's step inside a's does not shift a's frame count
    a_steps = [s for s, _ in mid.rows["a"]]
    assert a_steps == list(range(a_steps[0], a_steps[0] + len(a_steps)))


def test_an_abort_taken_mid_step_waits_for_the_step_boundary(loaded: LoadedTalker, tiny_dir: Path) -> None:
    rec = run(loaded, tiny_dir, True, abort_a=True)
    # a's step in flight completes and is its last; b, prefilled inside it, does not get a's slot yet
    assert len(rec.rows["a"]) == ARRIVES_AT + 1
    assert rec.slots["b"] != rec.slots["a"]
    # b's codes are those of a run in which a ends at that step by its frame cap (the same batches, no abort)
    capped = run(loaded, tiny_dir, True, a_frames=ARRIVES_AT + 1)
    assert len(capped.rows["a"]) == ARRIVES_AT + 1
    for rid in ("a", "b"):
        assert np.array_equal(codes(rec, rid), codes(capped, rid))


def test_a_failed_mid_step_prefill_fails_only_its_requests(loaded: LoadedTalker, tiny_dir: Path) -> None:
    rec = run(loaded, tiny_dir, True, fail_b=True)
    assert "b" not in rec.rows
    # a never shares a batch with b here, so it computes exactly what it computes alone
    assert np.array_equal(codes(rec, "a"), codes(run(loaded, tiny_dir, True, with_b=False), "a"))


def test_a_step_that_makes_first_frames_takes_no_mid_step_prefill(loaded: LoadedTalker, tiny_dir: Path) -> None:
    rec = run(loaded, tiny_dir, True, arrives_at=0)  # b arrives during a's own prefill step
    assert rec.rows["b"][0][0] == rec.rows["a"][0][0] + 1
    # what a run without mid-step prefill does, bit for bit; a's first frame, before b joins, is the one it gets alone
    boundary = run(loaded, tiny_dir, False, arrives_at=0)
    for rid in ("a", "b"):
        assert np.array_equal(codes(rec, rid), codes(boundary, rid))
    assert np.array_equal(codes(rec, "a")[:1], codes(run(loaded, tiny_dir, True, with_b=False), "a")[:1])

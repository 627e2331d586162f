"""The static step (talker/static_runner.py) with the tiny model, its programs run as written (not compiled: the
compiled ones are tested through the engine, tests/engine/test_compiled.py): a request's codes do not depend on its
batch, its bucket or when others join, and a compile that fails leaves the eager step."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from common.request import SpeechRequest
from frontend.frontend import Frontend, load_tokenizer
from talker.compiled import Programs, bucket_for, buckets_for, wants_compile
from talker.device import DeviceLayer
from talker.models.loader import LoadedTalker, load_talker
from talker.models.qwen3_tts.static import StaticTalker
from talker.runner import Runner
from talker.scheduler import Seq
from talker.snapshot import StepSnapshot
from talker.static_runner import StaticRunner, build_runner
from talker.worker import Stop, Submit, TalkerWorker

CPU = torch.device("cpu")
MAX_BATCH = 8
TEXTS = ["the quick brown fox jumps over the lazy dog", "a second voice joins", "three", "four is a longer one here",
         "five", "six six six", "seven", "eight and the last"]


class Recorder:
    """The worker's publisher: each request's codes in step order; `done` once `expect` requests have ended."""

    def __init__(self, expect: int) -> None:
        self.rows: defaultdict[str, list[np.ndarray]] = defaultdict(list)
        self.errors: list[BaseException] = []
        self.ended: set[str] = set()
        self.expect = expect
        self.done = threading.Event()

    def publish(self, snap: StepSnapshot) -> None:
        if snap.error is not None:
            self.errors.append(snap.error)
            self.done.set()
            return
        assert snap.codes is not None
        for row, (rid, _, _) in enumerate(snap.rows):
            codes = snap.codes[row].numpy().copy()
            if rid not in self.ended:
                self.rows[rid].append(codes)
            if codes[0] == 2150 or len(self.rows[rid]) >= 24:  # tiny's EOS, or the frame cap
                self.ended.add(rid)
        snap.release()
        if len(self.ended) >= self.expect:
            self.done.set()


@pytest.fixture(scope="module")
def loaded(tiny_dir: Path) -> LoadedTalker:
    return load_talker(tiny_dir, CPU, torch.float32)


@pytest.fixture(scope="module")
def programs(loaded: LoadedTalker) -> Programs:
    return Programs(StaticTalker(loaded.model.talker, loaded.cfg, 256), buckets_for(MAX_BATCH), compiled=False)


def seq_for(loaded: LoadedTalker, tiny_dir: Path, i: int) -> Seq:
    frontend = Frontend(loaded.cfg, loaded.generation, load_tokenizer(tiny_dir), 200, 256, 256)
    p = frontend.prepare(SpeechRequest(text=TEXTS[i], voice="aria", seed=10 + i, max_frames=24))
    return Seq(f"r{i}", p.prompt, p.params, p.seed, p.max_frames, None)


def run(loaded: LoadedTalker, tiny_dir: Path, programs: Programs, groups: list[list[int]]) -> Recorder:
    """Each group of requests is submitted once the previous one has been prefilled (they then share steps)."""
    args = (loaded.model.talker, loaded.cfg, MAX_BATCH, 256, 256, CPU, torch.float32)
    runner = StaticRunner(args, programs)
    recorder = Recorder(sum(len(g) for g in groups))
    worker = TalkerWorker(runner, DeviceLayer(CPU), MAX_BATCH, recorder, loaded.cfg.codec.eos, prefill_midstep=True)
    worker.start()
    for group in groups:
        worker.send(Submit(tuple(seq_for(loaded, tiny_dir, i) for i in group)))
    assert recorder.done.wait(120)
    worker.send(Stop())
    assert worker.join(30)
    assert not recorder.errors
    return recorder


def test_a_request_speaks_the_same_alone_and_in_any_batch(loaded: LoadedTalker, tiny_dir: Path,
                                                          programs: Programs) -> None:
    alone = run(loaded, tiny_dir, programs, [[0]]).rows["r0"]
    assert len(alone) > 2
    for groups in ([[0, 1, 2]], [list(range(8))], [[5, 6, 7], [0]], [[0], [1, 2, 3, 4]]):
        together = run(loaded, tiny_dir, programs, groups).rows["r0"]
        assert len(together) == len(alone) and all(np.array_equal(a, b) for a, b in zip(alone, together, strict=True))


def test_buckets_cover_every_batch() -> None:
    assert buckets_for(8) == (1, 2, 4, 8) and buckets_for(3) == (1, 2, 3) and buckets_for(100)[-1] == 100
    assert [bucket_for(n, buckets_for(32)) for n in (1, 2, 3, 5, 9, 17, 32)] == [1, 2, 4, 8, 16, 32, 32]


def test_auto_compiles_real_checkpoints_on_the_cpu_only(loaded: LoadedTalker) -> None:
    tiny = loaded.cfg
    assert not wants_compile("auto", CPU, tiny) and wants_compile("on", CPU, tiny)
    assert not wants_compile("off", CPU, tiny)


def test_a_compile_that_fails_leaves_the_eager_step(loaded: LoadedTalker, caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch._inductor.config as inductor
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # nothing cached: the compiler must run
    args = (loaded.model.talker, loaded.cfg, 1, 64, 64, CPU, torch.float32)
    # inductor's own patch (a monkeypatch's undo deletes the setting from its config module: later compiles fail)
    with inductor.patch({"cpp.cxx": (str(tmp_path / "no-such-compiler"),)}), \
            caplog.at_level(logging.WARNING, logger="talkstream.compile"):
        runner = build_runner(args, True, 1)
    assert type(runner) is Runner
    warned = [r.message for r in caplog.records if "runs eagerly" in r.message]
    assert len(warned) == 1 and "No working C++ compiler" in warned[0]

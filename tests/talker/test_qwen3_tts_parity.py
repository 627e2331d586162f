"""The official fixture checkpoint loads unchanged and speaks as the official package does (greedy).

The official package ran each text alone, so Talkstream does too where it is compared with it: a row's float
arithmetic may round differently in another batch on some CPUs. What batching must not do, let one row's content
reach another, is checked bit for bit between batches of the same shapes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from common.request import SpeechRequest
from frontend.frontend import Frontend, load_tokenizer
from output_builder.codecs.qwen12hz import Qwen12HzCodec
from talker.models.loader import load_talker
from talker.models.qwen3_tts.config import CheckpointError
from talker.runner import Runner
from talker.scheduler import Scheduler, Seq
from tests.conftest import OFFICIAL_TINY

pytestmark = pytest.mark.bitexact  # scripts/test runs these again under every other CPU capability
FIXTURE = OFFICIAL_TINY
TEXTS = ["hello world this is a tiny test", "the quick brown fox jumps over the lazy dog"]


def greedy_codes(texts: list[str], frames: int, max_batch: int = 4, voices: list[str] | None = None
                 ) -> list[np.ndarray]:
    """Run the fixture through Runner + Scheduler directly (no threads), all texts in one batch: codes [T, 16]
    per text (voice "ryan" unless `voices` says otherwise)."""
    dev = torch.device("cpu")
    loaded = load_talker(FIXTURE, dev, torch.float32)
    frontend = Frontend(loaded.cfg, loaded.generation, load_tokenizer(FIXTURE), 500, 256, 512)
    frontend.detects = False  # the official outputs were made with the language unset
    runner = Runner(loaded.model.talker, loaded.cfg, max_batch, 512, 256, dev, torch.float32)
    sched = Scheduler(max_batch, max_batch, 512)
    seqs = []
    for i, (text, voice) in enumerate(zip(texts, voices or ["ryan"] * len(texts), strict=True)):
        p = frontend.prepare(SpeechRequest(text=text, voice=voice, temperature=0.0, repetition_penalty=1.0))
        params = dataclasses.replace(p.params, subtalker_temperature=0.0)
        seqs.append(Seq(f"r{i}", p.prompt, params, p.seed, frames, []))
        sched.add(seqs[-1])
    step = 0
    while sched.has_work():
        plan = sched.schedule()
        codes = runner.sample(plan, runner.forward(plan, step))
        for row, seq in enumerate(plan.batch):
            seq.sink.append(codes[row].numpy())
        sched.commit(plan, step)
        sched.expire(step)
        step += 1
    return [np.stack(s.sink) for s in seqs]


def test_greedy_audio_matches_the_official_package() -> None:
    reference = np.load(str(FIXTURE) + ".reference.npz")
    codec = Qwen12HzCodec.from_pretrained(FIXTURE / "speech_tokenizer")
    for i, text in enumerate(TEXTS):
        (codes,) = greedy_codes([text], frames=119)  # alone, as the official package ran it
        wave = codec.decode(torch.from_numpy(codes.T).long()[None])[0].numpy()
        ref = reference[f"w{i}"]
        assert wave.shape == ref.shape == (119 * 1920,)
        assert float(np.abs(wave - ref).max()) < 1e-4


def test_a_batch_gives_each_request_its_own_codes() -> None:
    """Another voice for one row (same prompt length, so the same batch shapes) changes that row's codes and leaves
    the other row's bit-identical."""
    together = greedy_codes(TEXTS, frames=30)
    for i in range(len(TEXTS)):
        voices = ["vivian" if j != i else "ryan" for j in range(len(TEXTS))]
        mates_changed = greedy_codes(TEXTS, frames=30, voices=voices)
        assert np.array_equal(mates_changed[i], together[i])
        assert all(not np.array_equal(mates_changed[j], together[j]) for j in range(len(TEXTS)) if j != i)


def test_missing_and_malformed_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_talker(tmp_path, torch.device("cpu"), torch.float32)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"malformed checkpoint file .*config\.json"):
        load_talker(tmp_path, torch.device("cpu"), torch.float32)
    (tmp_path / "config.json").write_text((FIXTURE / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_talker(tmp_path, torch.device("cpu"), torch.float32)

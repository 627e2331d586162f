"""How much `--quantize int8` changes the audio: greedy codes with int8 weights against full precision.

  .venv/bin/python -m benchmarks.int8_agreement [--model tiny|PATH] [--frames 40] [--json]

Runs the same texts x voices greedily (temperature 0, no repetition penalty) through the Talker twice, in full
precision and with int8 weights, all requests in one batch each time (a row's int8 result does not depend on its
batch), and prints:
- code agreement: the share of the 16 codes of every frame position both runs reached that are equal. Generation is
  autoregressive, so one differing codebook-0 code sends the rest of a request down another path; this counts it;
- the share of requests identical to the end, and the frame where each first differs (median).
With `export-tiny --size 0.6b` weights (random) the logits have small margins, so this is a pessimistic figure
for a trained checkpoint. tests/talker/test_quantize.py checks the tiny checkpoint against a floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import torch

from common.request import SpeechRequest
from engine.config import default_cache_dir
from engine.tiny import ensure_tiny
from frontend.frontend import Frontend, load_tokenizer
from talker.models.loader import LoadedTalker, load_talker
from talker.runner import Runner
from talker.scheduler import Scheduler, Seq

TEXTS = [
    "Hello world, this is a test of the speech stream.",
    "The quick brown fox jumps over the lazy dog, and then the dog jumps over the fox.",
    "We can talk about the water and the day when you come to see what people know.",
    "This voice will make some sound for each word that you write in the test.",
    "Numbers like 42 and 1,024 are read as words; punctuation changes the pauses!",
    "Is it still raining? I think so. Let's wait a minute before we go out.",
]
VOICES = ["aria", "ben"]


def greedy_codes(loaded: LoadedTalker, ckpt: Path, frames: int) -> list[np.ndarray]:
    """Every text x voice in one batch, greedily: codes [T, 16] per request, up to EOS or `frames`."""
    cpu = torch.device("cpu")
    requests = [SpeechRequest(text=t, voice=v, temperature=0.0, repetition_penalty=1.0, max_frames=frames)
                for t in TEXTS for v in VOICES]
    frontend = Frontend(loaded.cfg, loaded.generation, load_tokenizer(ckpt), frames, 256, 256)
    runner = Runner(loaded.model.talker, loaded.cfg, len(requests), 512, 256, cpu, torch.float32)
    sched = Scheduler(len(requests), len(requests), 512)
    seqs = []
    for i, request in enumerate(requests):
        p = frontend.prepare(request)
        seqs.append(Seq(f"r{i}", p.prompt, p.params, p.seed, p.max_frames, []))
        sched.add(seqs[-1])
    step, eos = 0, loaded.cfg.codec.eos
    while sched.has_work():
        plan = sched.schedule()
        codes = runner.sample(plan, runner.forward(plan, step))
        sched.commit(plan, step)
        sched.expire(step)
        for row, seq in enumerate(plan.batch):
            if int(codes[row, 0]) == eos:
                sched.finish(seq)
            else:
                seq.sink.append(codes[row].numpy().astype(np.int64))
        step += 1
    return [np.stack(s.sink) if s.sink else np.zeros((0, 16), np.int64) for s in seqs]


def agreement(full: list[np.ndarray], int8: list[np.ndarray]) -> dict[str, float]:
    equal = total = identical = 0
    first_diff: list[int] = []
    for a, b in zip(full, int8, strict=True):
        n = min(len(a), len(b))
        same = a[:n] == b[:n]  # [n, 16]
        equal += int(same.sum())
        total += same.size + 16 * abs(len(a) - len(b))  # frames only one run made count as different
        rows = np.flatnonzero(~same.all(axis=1))
        if rows.size == 0 and len(a) == len(b):
            identical += 1
        first_diff.append(int(rows[0]) if rows.size else n)
    return {"code_agreement": equal / total, "identical_requests": identical / len(full),
            "first_difference_frame_median": statistics.median(first_diff), "requests": len(full)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    ckpt = ensure_tiny(default_cache_dir()) if args.model == "tiny" else Path(args.model)
    cpu = torch.device("cpu")
    full = greedy_codes(load_talker(ckpt, cpu, torch.float32), ckpt, args.frames)
    int8 = greedy_codes(load_talker(ckpt, cpu, torch.float32, "int8"), ckpt, args.frames)
    result = {"model": str(args.model), "frames": args.frames, **agreement(full, int8)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['requests']} requests, greedy, at most {args.frames} frames, {args.model}: "
              f"{result['code_agreement']:.1%} of codes equal to full precision; "
              f"{result['identical_requests']:.0%} of requests identical; "
              f"first difference at frame {result['first_difference_frame_median']} (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`talkstream bench aligner`: what word timestamps cost (issue 36).

1. **Alignment time** of the forced aligner alone, in this process on every core: median seconds per clip and per
   second of audio, for clips of 2, 5 and 10 s and a batch of four 5 s clips, at the given aligner's sizes and at
   Qwen3-ForcedAligner-0.6B's (random weights, written once under the cache directory: ~3.6 GB).
2. **Beside the Talker**: an engine on `tiny` with the aligner in its process; `--streams` requests arriving
   `--stagger-ms` apart, each a text of three sentences spoken as three segments of at most `--frames` frames (so
   the first segments are being aligned while later ones, and later requests, are generated), without timestamps
   and with them, alternating for `--rounds` rounds: first audio (p50, p90), the step gap (p50, p99) and the step's
   time, when the last audio came, the wall time (timestamps included), and how long after a segment's audio its
   timestamps came (p50, p90).

`--aligner DIR` (default: the tiny checkpoint in tests/fixtures/official/). With --json the last printed line is the
whole result as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from common.request import SpeechRequest
from engine.aligner.aligner import Aligner
from engine.aligner.model import AlignerConfig, ForcedAligner, checkpoint_name
from engine.aligner.words import Clip
from engine.config import EngineConfig, default_cache_dir
from engine.engine import Engine
from output_builder.streams import AudioStream, Timestamps
from talker.snapshot import step_gaps_us

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "official" / "qwen3-forced-aligner-tiny-official"
RATE = 24000
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs home again."
STORY = "The fox jumps over the dog. Then it runs home again. The dog sleeps on in the sun."
# Qwen3-ForcedAligner-0.6B's sizes (its released config.json)
SIZES_06B = {
    "audio": {"d_model": 1024, "encoder_layers": 24, "encoder_attention_heads": 16, "encoder_ffn_dim": 4096,
              "downsample_hidden_size": 480, "output_dim": 1024},
    "text": {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936},
}


def aligner_06b(source: Path, cache: Path) -> Path:
    """`source`'s tokenizer and features with random weights at the 0.6B sizes (made once, then kept)."""
    out = cache / "aligner-0.6b-random"
    if (out / "model.safetensors").is_file():
        return out
    tmp = out.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("*.safetensors", "config.json", "reference.json",
                                                                "*.wav"))
    cfg = json.loads((source / "config.json").read_text())
    cfg["thinker_config"]["audio_config"].update(SIZES_06B["audio"])
    cfg["thinker_config"]["text_config"].update(SIZES_06B["text"])
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    torch.manual_seed(0)
    model = ForcedAligner(AlignerConfig.load(tmp))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)  # random weights: the arithmetic, not the answers, is what is timed
    state = {checkpoint_name(k): v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"))
    tmp.rename(out)
    return out


def clip(seconds: float, seed: int) -> np.ndarray:
    """Noise with a slow envelope, int16 at 24 kHz (what the aligner gets is the served audio's kind)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    envelope = 0.5 + 0.5 * np.sin(np.linspace(0, 6 * np.pi * seconds, n))
    return (rng.standard_normal(n) * 3000 * envelope).astype(np.int16)


def time_alignment(directory: Path, rounds: int) -> dict[str, Any]:
    aligner = Aligner(directory)
    words = TEXT.split()
    cases = {f"{s}s": [Clip(clip(s, 1), RATE, " ".join(words[: max(2, int(s * 2.5))]), "english")] for s in (2, 5, 10)}
    cases["4x5s"] = [Clip(clip(5, i), RATE, TEXT, "english") for i in range(4)]
    aligner.align(cases["2s"])  # first call: kernels and caches
    out = {}
    for name, clips in cases.items():
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            aligner.align(clips)
            times.append(time.perf_counter() - start)
        audio = sum(c.pcm.size for c in clips) / RATE
        med = statistics.median(times)
        out[name] = {"s_per_call": round(med, 3), "s_per_audio_s": round(med / audio, 4)}
    return out


async def _read(stream: AudioStream) -> tuple[list[float], float]:
    """How long after the stream's audio so far each timestamps event came (seconds), and when its last audio came."""
    lags, last = [], time.monotonic()
    async for item in stream.events():
        now = time.monotonic()
        if isinstance(item, Timestamps):
            lags.append(now - last)
        else:
            last = now
    return lags, last


async def beside_the_talker(aligner: Path, streams: int, frames: int, rounds: int,
                            stagger_ms: float) -> dict[str, Any]:
    config = EngineConfig.from_env(model="tiny", max_batch=streams, max_queue=0, aligner=str(aligner),
                                   max_frames=frames)
    engine = Engine(config)
    await engine.start()
    keys = ("ttfa", "gap", "step", "wall", "audio", "lag")
    results: dict[str, dict[str, list[float]]] = {m: {k: [] for k in keys} for m in ("without", "with")}
    try:
        assert engine.worker is not None
        for r in range(rounds):
            for mode in ("without", "with"):
                engine.worker.timings.clear()
                start = time.monotonic()
                batch: list[AudioStream] = []
                reading = []
                for i in range(streams):
                    if i:
                        await asyncio.sleep(stagger_ms / 1e3)
                    batch.append(engine.submit(SpeechRequest(text=STORY, seed=i, language="english",
                                                             timestamps=mode == "with", request_id=f"{mode}-{r}-{i}")))
                    reading.append(asyncio.create_task(_read(batch[-1])))
                read = await asyncio.gather(*reading)
                res = results[mode]
                res["wall"].append(time.monotonic() - start)
                res["audio"].append(max(last for _, last in read) - start)
                res["ttfa"] += [s.time_to_first_audio * 1e3 for s in batch if s.time_to_first_audio is not None]
                timings = engine.worker.timings.snapshot()
                res["gap"] += step_gaps_us(timings)
                res["step"] += [(t.sample_end - t.forward_start) * 1e3 for t in timings]
                res["lag"] += [x * 1e3 for lags, _ in read for x in lags]
    finally:
        await engine.stop()

    def q(values: list[float], p: float) -> float:
        return round(float(np.percentile(values, p)), 1) if values else float("nan")

    return {mode: {"first_audio_ms_p50": q(v["ttfa"], 50), "first_audio_ms_p90": q(v["ttfa"], 90),
                   "step_gap_us_p50": q(v["gap"], 50), "step_gap_us_p99": q(v["gap"], 99),
                   "step_ms_p50": round(float(np.percentile(v["step"], 50)), 3),
                   "all_audio_s_p50": round(statistics.median(v["audio"]), 2),
                   "wall_s_p50": round(statistics.median(v["wall"]), 2),
                   **({"timestamps_after_audio_ms_p50": q(v["lag"], 50),
                       "timestamps_after_audio_ms_p90": q(v["lag"], 90)} if v["lag"] else {})}
            for mode, v in results.items()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="talkstream bench aligner", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--aligner", type=Path, default=TINY, help="an aligner checkpoint (default: the tiny fixture)")
    p.add_argument("--sizes", default="tiny,0.6b", help="tiny (the --aligner), 0.6b (random weights), both, or none")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--frames", type=int, default=48, help="a segment's frames at most (12.5 a second of audio)")
    p.add_argument("--stagger-ms", type=float, default=100.0, help="between one request's arrival and the next's")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--beside", default="tiny", help="the aligner sizes to run beside the Talker (tiny, 0.6b, none)")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s and s != "none"]
    beside = [s for s in args.beside.split(",") if s and s != "none"]
    dirs = {"tiny": args.aligner}
    if "0.6b" in sizes + beside:
        dirs["0.6b"] = aligner_06b(args.aligner, default_cache_dir())
    out: dict[str, Any] = {"alignment": {}, "beside_the_talker": {}}
    for size in sizes:
        out["alignment"][size] = res = time_alignment(dirs[size], args.rounds)
        for name, row in res.items():
            print(f"aligner {size:5} {name:5}: {row['s_per_call']:.3f} s a call, "
                  f"{row['s_per_audio_s']:.4f} s per second of audio")
    for size in beside:
        out["beside_the_talker"][size] = res = asyncio.run(
            beside_the_talker(dirs[size], args.streams, args.frames, args.rounds, args.stagger_ms))
        for mode, row in res.items():
            print(f"{args.streams} streams, aligner {size}, {mode:7} timestamps: " +
                  ", ".join(f"{k} {v}" for k, v in row.items()))
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

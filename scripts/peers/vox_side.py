"""vox's side of scripts/bench_peers: a `.tmod` built by vox's own tool, N sessions at once, each to at most
--max-frames frames, timed --repeat times after a warm-up run; prints one JSON line (the median run). Runs in the
peers' environment (vox-tts from PyPI), never Talkstream's."""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import vox

TEXTS = ["Hello there, this is a test of the speech server.", "The quick brown fox jumps over the lazy dog today.",
         "Streaming audio arrives in small pieces as it is made.", "Numbers like forty two are read out as words."]


def run(engine: vox.Engine, voice: vox.Voice, requests: int, frames: int) -> dict[str, float]:
    out: dict[int, tuple[float, float]] = {}

    def one(i: int, t0: float) -> None:
        first, samples = 0.0, 0
        session = engine.session(voice, max_frames=frames, seed=i, language="english")
        session.feed(TEXTS[i % len(TEXTS)])
        session.end()
        for chunk in session:
            first = first or time.perf_counter() - t0
            samples += len(chunk)
        out[i] = (samples / engine.sample_rate, first)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i, t0)) for i in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    audio = sum(a for a, _ in out.values())
    return {"audio_s": audio, "wall_s": wall, "audio_s_per_wall_s": audio / wall,
            "ttfa_p50_s": statistics.median(f for _, f in out.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="a .tmod built by `python -m vox build`")
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--max-frames", type=int, default=24)
    ap.add_argument("--threads", type=int, default=0, help="vox's threads (0: its own choice)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    engine = vox.Engine(args.model, device="cpu", threads=args.threads)
    voice = engine.speaker_voice(engine.speakers[0])
    run(engine, voice, 1, args.max_frames)  # warm-up
    runs = sorted((run(engine, voice, args.requests, args.max_frames) for _ in range(args.repeat)),
                  key=lambda r: r["audio_s_per_wall_s"])
    print(json.dumps({"side": f"vox-tts {vox.__version__ if hasattr(vox, '__version__') else ''}".strip(),
                      "requests": args.requests, **runs[len(runs) // 2]}))


if __name__ == "__main__":
    main()

"""`talkstream bench text-front`: what the text front-end costs a request on the event loop, where it runs.

For short texts in English and Chinese, with numbers and symbols and without, and 4,096-character ones (English, and
the two mixed), it times (median of `--repeat` runs, microseconds) `Frontend.prepare` with language detection and
without (a named language), and alone: the detection of each segment, the respellings of a 1,000-entry lexicon, the
pause tags' parsing and the normalisation in the text's language. The frontend is that of the
checkpoint given (default `tiny`; its tokenizer and segment budget are the engine's). With --json the last printed
line is the whole result as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from common.request import SpeechRequest
from engine.config import EngineConfig
from engine.loaded import frontend_for
from frontend.language import LanguageDetector
from frontend.lexicon import Lexicon
from frontend.pauses import split_pauses

ENGLISH = "The weather is lovely today, and we are going for a walk along the river before lunch. "
CHINESE = "今天天气很好，我们午饭前沿着河边散步，然后去公园看看花。"
TEXTS = {
    "english_short": ENGLISH.strip(),
    "chinese_short": CHINESE,
    "english_numbers": "It costs $3.50 at 7:30 pm on 12/05/2026, 42% off 1,200 items at 60 km/h.",
    "chinese_numbers": "价格是3.5元，42%的人在2024-05-03 7:30到了，车速60km/h。",
    "english_4096": (ENGLISH * 60)[:4096],
    "mixed_4096": ((ENGLISH + CHINESE) * 40)[:4096],
}


def median_us(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 1)


def detect_all(detector: LanguageDetector, segments: list[str]) -> list[str | None]:
    return [detector.detect(s) for s in segments]


def measure(model: str, repeat: int) -> dict[str, Any]:
    frontend = frontend_for(EngineConfig(model=model).validate())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lexicon.json"
        path.write_text(json.dumps({f"word{i}": f"respelled {i}" for i in range(1000)} | {"walk": "stroll"}))
        lexicon = Lexicon.load(path)
    frontend.detector.detect("Warm up.")
    result: dict[str, Any] = {"model": model, "repeat": repeat, "texts": {}}
    for name, text in TEXTS.items():
        auto, named = SpeechRequest(text=text, voice=None), SpeechRequest(text=text, language="english")
        prepared = frontend.prepare(auto)
        segments = frontend.split(text, frontend.settings(auto))
        result["texts"][name] = {
            "chars": len(text), "segments": len(prepared.segments),
            "prepare_detected_us": median_us(partial(frontend.prepare, auto), repeat),
            "prepare_named_us": median_us(partial(frontend.prepare, named), repeat),
            "detect_all_segments_us": median_us(partial(detect_all, frontend.detector, segments), repeat),
            "lexicon_1000_us": median_us(partial(lexicon.apply, text), repeat),
            "pause_tags_us": median_us(partial(split_pauses, text), repeat),
            "normalize_us": median_us(partial(frontend.normalizer.normalize, text, prepared.language), repeat),
            "detected": list(prepared.detected or ()),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="talkstream bench text-front", description=__doc__)
    p.add_argument("--model", default="tiny")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = measure(args.model, args.repeat)
    print(f"text front-end, model {result['model']}, median of {result['repeat']} runs (µs)")
    print(f"{'text':15} {'chars':>5} {'segs':>4} {'prepare+detect':>14} {'prepare named':>13} {'detect':>8} "
          f"{'lexicon':>8} {'pauses':>7} {'normalize':>9}")
    for name, r in result["texts"].items():
        print(f"{name:15} {r['chars']:5} {r['segments']:4} {r['prepare_detected_us']:14} {r['prepare_named_us']:13} "
              f"{r['detect_all_segments_us']:8} {r['lexicon_1000_us']:8} {r['pause_tags_us']:7} "
              f"{r['normalize_us']:9}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Write tests/fixtures/aligner_reference.json: the official forced aligner's words and times for more cases than
its fixture's own reference.json (other languages, Korean among them, a clip over 8 s, a 24 kHz clip), with the tiny
checkpoint in tests/fixtures/official/, and the official Korean words of more texts.

    scripts/oracle/setup-aligner                    # builds .asr-oracle-venv (qwen-asr 0.0.6)
    .asr-oracle-venv/bin/python scripts/oracle/make_aligner_reference.py

Each case is one `Qwen3ForcedAligner.align` call with one clip (given as (samples, rate), float32), as
tests/fixtures/official/README.md describes; the clips are made from that directory's audio by
tests/engine/aligner/aligner_clips.py, which the test uses too.
"""

import json
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from qwen_asr import Qwen3ForcedAligner

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "tests" / "fixtures" / "official"
CHECKPOINT = SHARED / "qwen3-forced-aligner-tiny-official"
OUT = ROOT / "tests" / "fixtures" / "aligner_reference.json"

sys.path.insert(0, str(ROOT / "tests" / "engine" / "aligner"))
from aligner_clips import CASES, KOREAN_TEXTS, clip  # noqa: E402  (shared with the test that reads this file)


def main() -> None:
    torch.manual_seed(0)
    aligner = Qwen3ForcedAligner.from_pretrained(str(CHECKPOINT), dtype=torch.float32)
    cases = []
    for name, spec in CASES.items():
        pcm, rate = clip(spec, lambda p: sf.read(p, dtype="int16"), SHARED)
        audio = pcm.astype(np.float32) / 32768.0
        result = aligner.align(audio=(audio, rate), text=spec["text"], language=spec["language"])[0]
        words = [{"word": it.text, "start_time": it.start_time, "end_time": it.end_time} for it in result]
        cases.append({"name": name, **spec, "words": words})
        print(name, len(words), "words")
    # the official Korean cut alone (the processor's word list and soynlp's LTokenizer)
    korean = [{"text": text, "words": aligner.aligner_processor.encode_timestamp(text, "korean")[0]}
              for text in KOREAN_TEXTS]
    import importlib.metadata as md
    made = {k: md.version(k) for k in ("qwen-asr", "transformers", "torch", "nagisa", "soynlp")}
    out = {"made_with": made, "cases": cases, "korean_words": korean}
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()

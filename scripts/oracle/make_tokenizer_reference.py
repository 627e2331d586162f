"""Write the official package's token ids for a set of hard texts, for each kind of tokenizer a checkpoint can carry.

Runs in the oracle environment (scripts/oracle/setup), never in Talkstream's:

    .oracle-venv/bin/python scripts/oracle/make_tokenizer_reference.py   # -> tests/fixtures/tokenizer_reference.json

The official package tokenizes with `AutoProcessor.from_pretrained(path, fix_mistral_regex=True)` (a Qwen2 tokenizer,
transformers 4.57.3) and builds its prompt texts with `_build_assistant_text` / `_build_instruct_text`; this script
does the same for three checkpoints:
- `json`: the CustomVoice fixture as the official package wrote it (tokenizer.json, used as it is);
- `vocab`: the same without tokenizer.json (vocab.json + merges.txt: Qwen2's pre-tokenizer rules and NFC);
- `rules`: `vocab` plus a few merges (tests/fixtures/tokenizer-rules/) that only Qwen2's pre-tokenizer can reach
  ("(h" after punctuation, no multi-digit pieces), so that rules a loader gets wrong show in the ids.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/official/qwen3-tts-tiny-official-cv"
RULES = ROOT / "tests/fixtures/tokenizer-rules"
OUT = ROOT / "tests/fixtures/tokenizer_reference.json"
TEXTS = [
    "Hello there.", "(hello) [world]", "cafe\u0301 and caf\u00e9", "Ångström \u212b", "123 4567 3.14 1,000",
    "你好，世界。", "こんにちは、世界！", "안녕하세요", "emoji 😀👍🏽 and 🇫🇷!", "mixed: Привет, 世界 and héllo...",
    "tabs\tand\nnewlines\n\nhere", "  leading and trailing  ", "it's can't we'll", "x<tts_pad>y", "<|im_end|> tail",
    "ﬁ ligature and ①②", "\u00a0non-breaking\u2009thin", "!!!???...",
]
EXTRA_MERGES = [("(", "h"), ("(h", "e"), ("1", "2"), ("12", "3"), ("4", "5"), ("45", "6")]


def write_rules_tokenizer() -> None:
    """The `vocab` checkpoint's tokenizer files plus EXTRA_MERGES (their pieces appended to the vocabulary)."""
    RULES.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((FIXTURE / "vocab.json").read_text())
    lines = (FIXTURE / "merges.txt").read_text().rstrip("\n").split("\n")
    header = [line for line in lines[:1] if line.startswith("#")]
    for left, right in EXTRA_MERGES:
        vocab.setdefault(left + right, max(vocab.values()) + 1)
    # first: a merge's rank is its line, and these must win over the fixture's own ("he" would take the "h")
    merges = [*header, *(f"{left} {right}" for left, right in EXTRA_MERGES), *lines[len(header):]]
    (RULES / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (RULES / "merges.txt").write_text("\n".join(merges) + "\n")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(FIXTURE / name, RULES / name)


def official_ids(directory: Path) -> dict[str, dict[str, list[int]]]:
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, Qwen3TTSProcessor
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
    from transformers import AutoConfig, AutoModel, AutoProcessor

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoModel.register(Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, exist_ok=True)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor, exist_ok=True)
    processor = AutoProcessor.from_pretrained(str(directory), fix_mistral_regex=True)

    def ids(text: str) -> list[int]:
        return processor(text=text, return_tensors="pt", padding=True)["input_ids"][0].tolist()

    wrapper = Qwen3TTSModel.__new__(Qwen3TTSModel)  # only its prompt-text builders are used
    return {t: {"assistant": ids(wrapper._build_assistant_text(t)), "instruct": ids(wrapper._build_instruct_text(t))}
            for t in TEXTS}


def checkpoint(kind: str, work: Path) -> Path:
    """A directory holding `kind`'s tokenizer files and the fixture's config.json (AutoProcessor reads it)."""
    d = work / kind
    d.mkdir()
    shutil.copy(FIXTURE / "config.json", d / "config.json")
    names = ["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"]
    source = RULES if kind == "rules" else FIXTURE
    for name in [*names, "tokenizer.json"] if kind == "json" else names:
        shutil.copy(source / name, d / name)
    return d


def main() -> int:
    import transformers

    write_rules_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        reference = {kind: official_ids(checkpoint(kind, Path(tmp))) for kind in ("json", "vocab", "rules")}
    OUT.write_text(json.dumps({"transformers": transformers.__version__, "texts": TEXTS, "ids": reference},
                              ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

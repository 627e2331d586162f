"""The oracle fixtures: the official package's outputs for Talkstream's tiny checkpoint, and where they came from.

Written by scripts/oracle/make_reference; read by the parity tests without the oracle environment.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.tiny import fingerprint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ORACLE_NPZ = FIXTURES / "oracle_tiny.npz"
ORACLE_CONFIG = FIXTURES / "oracle_tiny_config.json"
REGENERATE = "regenerate them with scripts/oracle/make_reference"
# The generator's draws are the same bits on every CPU (common/portable_random.py), the codec's included, so
# every weight file must match the one the fixtures were written from.
HASHED = ("model.safetensors", "speech_tokenizer/model.safetensors", "tokenizer.json")


def describe_checkpoint(ckpt: Path) -> dict[str, Any]:
    """What identifies a tiny checkpoint: the generator's fingerprint, its configs and its weight files' hashes."""
    return {
        "fingerprint": fingerprint(),
        "config": json.loads((ckpt / "config.json").read_text()),
        "generation_config": json.loads((ckpt / "generation_config.json").read_text()),
        "sha256": {name: hashlib.sha256((ckpt / name).read_bytes()).hexdigest() for name in HASHED},
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def stale_reason(ckpt: Path) -> str | None:
    """Why the committed fixtures do not describe this tiny checkpoint (None when they do)."""
    if not (ORACLE_NPZ.is_file() and ORACLE_CONFIG.is_file()):
        return f"oracle fixtures missing; {REGENERATE}"
    recorded = json.loads(ORACLE_CONFIG.read_text())
    current = describe_checkpoint(ckpt)
    for key in ("fingerprint", "config", "generation_config"):
        if recorded.get(key) != current[key]:
            return f"the tiny generator changed ({key} differs from {ORACLE_CONFIG.name}); {REGENERATE}"
    for name in HASHED:
        if recorded.get("sha256", {}).get(name) != current["sha256"][name]:
            return f"the tiny generator changed ({name} differs from {ORACLE_CONFIG.name}); {REGENERATE}"
    return None


@dataclass(frozen=True, slots=True)
class Case:
    index: int
    text: str
    voice: str
    speaker: str
    language: str
    instructions: str | None
    non_streaming_mode: bool
    max_new_tokens: int
    frames: int
    eos: bool
    codes: np.ndarray  # [frames, 16], up to (not including) EOS
    ids: np.ndarray  # the official tokenization of the assistant text
    logits: np.ndarray  # [vocab] the first frame's codebook-0 logits, before suppression and sampling


@dataclass(frozen=True, slots=True)
class Oracle:
    cases: list[Case]
    wave_case: int
    wave: np.ndarray
    sample_rate: int
    sampled_case: int
    sampled: dict[int, np.ndarray]
    sampling: dict[str, Any]
    versions: dict[str, str]


def load_oracle() -> Oracle:
    data = np.load(ORACLE_NPZ)
    meta = json.loads(str(data["meta"]))
    cases = [
        Case(index=i, codes=data[f"codes_{i}"].astype(np.int64), ids=data[f"ids_{i}"].astype(np.int64),
             logits=data[f"logits_{i}"], **c)
        for i, c in enumerate(meta["cases"])
    ]
    sampled = {s: data[f"sampled_{s}"].astype(np.int64) for s in meta["sampled_seeds"]}
    return Oracle(cases, meta["wave_case"], data["wave"], meta["sample_rate"], meta["sampled_case"], sampled,
                  meta["sampling"], meta["versions"])

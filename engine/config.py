"""The one engine configuration: validated once, passed down explicitly. Environment variables are read here;
the tuning knobs beside it (engine/tuning.py) are not settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from engine.tuning import Tuning


class OutputMode(StrEnum):
    ASYNC = "async"
    SYNC = "sync"


ENV_PREFIX = "TALKSTREAM_"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "talkstream"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What a user sets (flags, or TALKSTREAM_<FIELD> variables). How the engine runs is `tuning`."""

    model: str = "tiny"  # "tiny", a checkpoint directory, or a Hugging Face Hub repository id
    revision: str | None = None  # of a Hub repository: a branch, tag or commit (default: main)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16
    quantize: str | None = None  # "int8": int8 weights for the Talker's linear layers (faster, changes the audio)
    compile: str = "auto"  # auto | on | off: the decode step as compiled static programs (talker/compiled.py)
    output_mode: OutputMode = OutputMode.ASYNC
    max_batch: int = 32  # Talker slots
    max_queue: int = 64  # requests waiting for a slot before new ones are refused
    max_len: int = 2048  # KV positions per slot (prompt + frames)
    max_frames: int = 1024  # per request (82 s of audio); at most max_len // 2
    max_ahead_s: float = 8.0  # audio buffered ahead of a reader before its request is paused
    reader_timeout_s: float = 30.0  # a reader that reads nothing for this long while audio waits is dropped
    text_timeout_s: float = 10.0  # a text arriving over time that is quiet this long ends as if finished
    lexicon: Path | None = None  # a JSON object of word → respelling (frontend/lexicon.py); SIGHUP reloads it
    aligner: str | None = None  # a Qwen3-ForcedAligner checkpoint (directory or Hub id): word timestamps on request
    cache_dir: Path = field(default_factory=default_cache_dir)
    tuning: Tuning = field(default_factory=Tuning)  # not read from the environment

    def validate(self) -> EngineConfig:
        for name in ("max_batch", "max_len", "max_frames"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if min(self.max_ahead_s, self.reader_timeout_s, self.text_timeout_s) <= 0:
            raise ValueError("max_ahead_s, reader_timeout_s and text_timeout_s must be > 0")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], not {self.device!r}")
        if self.compile not in ("auto", "on", "off"):
            raise ValueError(f"compile must be auto, on or off, not {self.compile!r}")
        if self.quantize not in (None, "int8"):
            raise ValueError(f"quantize must be int8 (or unset), not {self.quantize!r}")
        if not self.model.strip():
            raise ValueError("model must be 'tiny', a checkpoint directory or a Hub repository id")
        return replace(self, output_mode=OutputMode(self.output_mode), cache_dir=Path(self.cache_dir),
                       lexicon=Path(self.lexicon) if self.lexicon else None, tuning=self.tuning.validate())

    def tuned(self, **knobs: Any) -> EngineConfig:
        """This config with some tuning knobs changed (tests, benchmarks)."""
        return replace(self, tuning=replace(self.tuning, **knobs)).validate()

    @classmethod
    def from_env(cls, **overrides: Any) -> EngineConfig:
        """Defaults, then TALKSTREAM_* environment variables, then explicit overrides (e.g. CLI flags)."""
        values: dict[str, Any] = {}
        defaults = cls()
        for f in fields(cls):
            raw = os.environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _tuning(raw) if f.name == "tuning" else _parse(raw, getattr(defaults, f.name))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).validate()


def _tuning(raw: str) -> Tuning:
    """`TALKSTREAM_TUNING="native_kernels=0,warmup=0"`: knobs for debugging and tests, not settings."""
    base, knobs = Tuning(), {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, value = item.partition("=")
        if name not in Tuning.__dataclass_fields__:
            known = ", ".join(Tuning.__dataclass_fields__)
            raise ValueError(f"TALKSTREAM_TUNING: unknown knob {name!r}; known: {known}")
        knobs[name] = _parse(value, getattr(base, name))
    return replace(base, **knobs)


def _parse(raw: str, default: Any) -> Any:
    if default is None:
        return raw or None
    if isinstance(default, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, Path):
        return Path(raw)
    return type(default)(raw)


def api_key_from_env() -> str | None:
    return os.environ.get(ENV_PREFIX + "API_KEY") or None

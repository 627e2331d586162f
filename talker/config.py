"""The one engine configuration: validated once, passed down explicitly. Environment variables are read here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any


class OutputMode(StrEnum):
    ASYNC = "async"
    SYNC = "sync"


ENV_PREFIX = "TALKSTREAM_"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "talkstream"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = "tiny"  # "tiny", a checkpoint directory, or a Hugging Face Hub repository id
    revision: str | None = None  # of a Hub repository: a branch, tag or commit (default: main)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16
    quantize: str | None = None  # "int8": int8 weights for the Talker's linear layers (faster, changes the audio)
    output_mode: OutputMode = OutputMode.ASYNC
    max_batch: int = 32  # Talker slots
    max_queue: int = 64  # requests waiting for a slot before new ones are refused
    max_prefills_per_step: int = 32  # new requests prefilled together in one step (a burst shares one prefill)
    max_prefill_tokens: int = 2048  # and only while count x longest prompt fits: bounds the step others wait on
    prefill_alone: bool = True  # new requests' prefill as a step of its own (the running ones sit it out)
    prefill_midstep: bool = True  # and run between the code predictor's sub-steps of the step in flight, not after it
    max_len: int = 2048  # KV positions per slot (prompt + frames)
    max_frames: int = 1024  # per request (82 s of audio); at most max_len // 2
    text_width: int = 4608  # text tokens per request (4096 characters of any script fit)
    first_chunk_frames: int = 1  # 80 ms of audio: the first chunk leaves after one step
    chunk_frames: int = 8  # the largest chunk: sizes double from first_chunk_frames up to it
    codec_batch_frames: int = 64  # frames per backlog codec call (first chunks go on their own lane)
    codec_hold_s: float = 0.02  # a backlog codec call waits up to this long while a first chunk is due
    max_ahead_s: float = 8.0  # audio buffered ahead of a reader before its request is paused
    reader_timeout_s: float = 30.0  # a reader that reads nothing for this long while audio waits is dropped
    codec_timeout_s: float = 30.0  # a codec decode call that takes longer fails its requests and kills the engine
    text_timeout_s: float = 10.0  # a text arriving over time that is quiet this long ends as if finished
    torch_threads: int = 0  # per worker; 0: from the model's size and the cores (talker/device.py)
    worker_nice: int = 5  # the Talker thread and the codec process yield a busy core to the event loop
    native_kernels: bool = True  # the codec's and sampler's CPU kernels (compiled when the package is installed)
    cache_dir: Path = field(default_factory=default_cache_dir)
    warmup: bool = True
    timing_ring: int = 4096

    def validate(self) -> EngineConfig:
        positive = ("max_batch", "max_prefills_per_step", "max_prefill_tokens", "max_len", "max_frames", "text_width",
                    "first_chunk_frames", "chunk_frames", "codec_batch_frames", "timing_ring")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_queue < 0 or self.torch_threads < 0:
            raise ValueError("max_queue and torch_threads must be >= 0")
        if min(self.max_ahead_s, self.reader_timeout_s, self.codec_timeout_s, self.text_timeout_s) <= 0:
            raise ValueError("max_ahead_s, reader_timeout_s, codec_timeout_s and text_timeout_s must be > 0")
        if self.codec_hold_s < 0:
            raise ValueError("codec_hold_s must be >= 0")
        if not 0 <= self.worker_nice <= 19:
            raise ValueError("worker_nice must be in [0, 19]")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], not {self.device!r}")
        if self.quantize not in (None, "int8"):
            raise ValueError(f"quantize must be int8 (or unset), not {self.quantize!r}")
        if not self.model.strip():
            raise ValueError("model must be 'tiny', a checkpoint directory or a Hub repository id")
        return replace(self, output_mode=OutputMode(self.output_mode), cache_dir=Path(self.cache_dir))

    @classmethod
    def from_env(cls, **overrides: Any) -> EngineConfig:
        """Defaults, then TALKSTREAM_* environment variables, then explicit overrides (e.g. CLI flags)."""
        values: dict[str, Any] = {}
        defaults = cls()
        for f in fields(cls):
            raw = os.environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(raw, getattr(defaults, f.name))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).validate()


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

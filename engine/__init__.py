"""The engine's public API: what the server, and anyone driving Talkstream from Python, imports.

`Engine` (start, submit, stop; `engine/engine.py`) is the composition root: it loads a checkpoint and wires the
Talker worker (talker/) to the output side (output_builder/). Nothing below this package imports it. The heavy
parts (torch) load on first use, so `from engine import EngineConfig` stays light.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.request import (
    MAX_INPUT_CHARS,
    MAX_TEXT_S,
    MIN_TEXT_RATE,
    ClonePrompt,
    EngineBusyError,
    EngineDeadError,
    EngineState,
    FinishReason,
    RequestError,
    RequestFailedError,
    SamplingParams,
    SpeechRequest,
    StreamingSpeechRequest,
    TextEnd,
    TextLayout,
    VoiceKind,
)
from engine.config import EngineConfig, OutputMode, api_key_from_env, default_cache_dir

if TYPE_CHECKING:
    from common.children import die_with_parent, spawn
    from engine.engine import Engine
    from engine.text_input import SpeechInput
    from output_builder.streams import AudioStream, Timestamps, Usage
    from talker.snapshot import StepTiming

_LAZY = {"Engine": "engine.engine", "SpeechInput": "engine.text_input", "AudioStream": "output_builder.streams",
         "Usage": "output_builder.streams", "Timestamps": "output_builder.streams", "StepTiming": "talker.snapshot",
         # for a child process of the server's own: it dies with the server (common/children.py)
         "die_with_parent": "common.children", "spawn": "common.children"}

__all__ = [
    "MAX_INPUT_CHARS", "MAX_TEXT_S", "MIN_TEXT_RATE", "AudioStream", "ClonePrompt", "Engine", "EngineBusyError",
    "EngineConfig", "EngineDeadError", "EngineState", "FinishReason", "OutputMode", "RequestError",
    "RequestFailedError", "SamplingParams", "SpeechInput", "SpeechRequest", "StepTiming", "StreamingSpeechRequest",
    "TextEnd", "TextLayout", "Timestamps", "Usage", "VoiceKind", "api_key_from_env", "default_cache_dir",
    "die_with_parent", "resolve_checkpoint", "spawn",
]


def resolve_checkpoint(model: str, revision: str | None = None, refresh: bool = False,
                       cache_dir: Path | None = None) -> Path:
    """A checkpoint directory (a Talker's or a forced aligner's), or a Hugging Face Hub id fetched into (or found in)
    the Hub cache. For a forced aligner, the official Korean word list is fetched into `cache_dir` too (default the
    server's), so that a server started offline later has it."""
    from engine.aligner.korean import find_wordlist
    from engine.aligner.model import checked as aligner_files
    from engine.aligner.model import is_aligner
    from talker.models.hub import checked, resolve

    path = resolve(model, revision, refresh=refresh,
                   check=lambda d: aligner_files(d) if is_aligner(d) else checked(d))
    if is_aligner(path):
        find_wordlist(path, cache_dir or default_cache_dir())
    return path


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")

"""Typed seam between the server, the engine API and the Talker worker."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import StrEnum

_ids = itertools.count(1)
MAX_INPUT_CHARS = 4096  # input and instructions; a longer input's speech is split into segments anyway


class FinishReason(StrEnum):
    EOS = "eos"
    MAX_FRAMES = "max_frames"  # the client's max_frames, or the server's cap on a segment
    SPEECH_CAP = "speech_cap"  # the length its text allows (no runaway audio: frontend/frontend.py)
    REPETITION = "repetition"  # the Talker looped, repeating the same codes (output_builder/repetition.py)
    CANCELLED = "cancelled"
    ERROR = "error"


class TextLayout(StrEnum):
    """Where the text goes (Qwen3-TTS's two modes): all of it in the prompt, or one token per frame after the first.
    A text that arrives over time can only be fed one token per frame."""

    FULL = "full"
    STREAMING = "streaming"


# A streamed text's writer must keep it moving, or it holds an admission place for nothing: past its first
# `text_timeout_s`, a text averaging under 1 visible character a second (an LLM writes tens, a typist several) is
# ended, and none stays open past 10 minutes (a 4096-character answer at 10 characters a second takes 7).
MIN_TEXT_RATE = 1.0  # visible characters per second, averaged since the text opened
MAX_TEXT_S = 600.0


class TextEnd(StrEnum):
    """Why the engine ended a streamed text for its writer, as if it had finished it."""

    QUIET = "went quiet"  # no visible character for `text_timeout_s`
    SLOW = "came too slowly"  # under MIN_TEXT_RATE
    EXPIRED = "was open too long"  # MAX_TEXT_S


class EngineState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    DEAD = "dead"
    STOPPED = "stopped"


class RequestError(ValueError):
    """A recoverable, per-request error: bad input, or a failure that ends only this request."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def __reduce__(self) -> tuple[type[RequestError], tuple[str, str | None, str | None]]:
        return type(self), (self.message, self.param, self.code)  # across processes, with its param and code


class RequestFailedError(RuntimeError):
    """A request that was valid failed while it was being generated or decoded; only it ends."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class EngineBusyError(RuntimeError):
    """The admission queue is full; retry later."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineDeadError(RuntimeError):
    """The engine cannot continue (or is not running); no request can be served."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling for codebook 0 (the Talker) and the residual codebooks (the code predictor).

    `temperature == 0` means greedy for both.
    """

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0

    def validate(self) -> None:
        checks = (
            (0.0 <= self.temperature <= 2.0, "temperature", "must be between 0 and 2"),
            (self.top_k >= 0, "top_k", "must be >= 0 (0 disables top-k)"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (0.5 <= self.repetition_penalty <= 2.0, "repetition_penalty", "must be between 0.5 and 2"),
            (0.0 <= self.subtalker_temperature <= 2.0, "subtalker_temperature", "must be between 0 and 2"),
            (self.subtalker_top_k >= 0, "subtalker_top_k", "must be >= 0"),
            (0.0 < self.subtalker_top_p <= 1.0, "subtalker_top_p", "must be in (0, 1]"),
        )
        for ok, name, why in checks:
            if not ok:
                raise RequestError(f"{name} {why}", param=name)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class ClonePrompt:
    """A voice cloned from a reference recording, for checkpoints that clone (Qwen3-TTS Base): the speaker
    encoder's x-vector and, for in-context cloning, the reference's codec codes and its transcript. Plain data, so
    that it can be stored, and crosses threads by value."""

    x_vector: tuple[float, ...]
    ref_codes: tuple[tuple[int, ...], ...] | None = None  # [frames][codebooks]: in-context cloning only
    ref_text: str | None = None  # the reference's words (in-context cloning only)

    @property
    def in_context(self) -> bool:
        return self.ref_codes is not None


class VoiceKind(StrEnum):
    """What a checkpoint's voices are (its `tts_model_type`)."""

    CUSTOM_VOICE = "custom_voice"  # named speakers
    BASE = "base"  # voices cloned from a recording
    VOICE_DESIGN = "voice_design"  # voices described in words (the instructions)


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    """What a client asks for. Unset sampling fields take the checkpoint's generation defaults."""

    text: str
    voice: str | None = None
    language: str | None = None
    instructions: str | None = None
    design: str | None = None  # a created voice's description (VoiceDesign): said ahead of the instructions
    seed: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_frames: int | None = None  # the whole response's frames at most (a limit the client set)
    text_layout: TextLayout | None = None  # None: the official default of the checkpoint's kind
    normalize: bool = True  # numbers and symbols as words, in the text's language (frontend/normalize.py)
    timestamps: bool = False  # each segment's words timed by the engine's aligner (engine/aligning.py)
    clone: ClonePrompt | None = None  # a cloned voice (Base checkpoints), instead of `voice`
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")


@dataclass(frozen=True, slots=True)
class StreamingSpeechRequest(SpeechRequest):
    """A request whose text arrives while it is spoken: `text` is its first piece (it may be empty), and the handle
    `Engine.submit` returns for it takes the rest (`append`, then `finish`). Always in the streaming layout."""

    text: str = ""

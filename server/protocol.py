"""Wire models of the HTTP API: the speech request, its SSE events, errors and the small listing endpoints.
The Realtime protocol's models are in server/realtime/protocol.py."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from engine import MAX_INPUT_CHARS, FinishReason, Timestamps

MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def _unicode(text: str) -> str:
    """A lone surrogate (JSON allows "\\ud800") is not a character: it cannot be tokenized, logged or echoed."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate, which is not valid Unicode text") from None
    return text


Text = Annotated[str, StringConstraints(strict=True), AfterValidator(_unicode)]
Name = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=256), AfterValidator(_unicode)]
ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class StreamFormat(StrEnum):
    AUDIO = "audio"
    SSE = "sse"


class ResponseStatus(StrEnum):
    """How a response ended, in OpenAI's words: `incomplete` is cut short by a limit."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    CANCELLED = "cancelled"
    FAILED = "failed"


# Why a response is `incomplete` (`status_details.reason`), for SSE and Realtime alike: OpenAI's own word for a
# client's limit; Talkstream's for its guards against runaway audio (docs/api.md)
INCOMPLETE_REASONS = {
    FinishReason.MAX_FRAMES: "max_output_tokens",  # the client's max_frames, or the server's cap on a segment
    FinishReason.SPEECH_CAP: "max_speech_length",  # the length the text allows
    FinishReason.REPETITION: "repetition",  # the Talker repeated itself in a loop
}


def incomplete(reason: FinishReason | None, realtime: bool = False) -> dict[str, Any] | None:
    """`status_details` of a response cut short (None: it was not). Realtime's `reason` is one of OpenAI's (the SDK's
    types know no other): a guard's own reason goes beside it, as `cause`."""
    why = INCOMPLETE_REASONS.get(reason) if reason is not None else None
    if why is None:
        return None
    if realtime and why != "max_output_tokens":
        return {"type": "incomplete", "reason": "max_output_tokens", "cause": why}
    return {"type": "incomplete", "reason": why}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class VoiceRef(_Strict):
    id: Name


class SamplingFields(_Strict):
    """Talkstream's extensions, shared by the speech request and the Realtime session."""

    seed: int | None = Field(default=None, ge=0, lt=2**63, description=(
        "Any non-negative 63-bit integer; the sampler uses its low 31 bits, so seeds that differ only above bit 30 "
        "give the same audio"))
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, ge=0.5, le=2.0)


class SpeechBody(SamplingFields):
    """`POST /v1/audio/speech`, as in OpenAI's speech API, plus `seed`, `sample_rate` and sampling parameters."""

    model: Name = Field(description="The served model's id, or one of tts-1, tts-1-hd, gpt-4o-mini-tts")
    input: Text = Field(min_length=1, max_length=MAX_INPUT_CHARS,
                        description=f"At most {MAX_INPUT_CHARS} characters; a long text is spoken in full")
    voice: Name | VoiceRef | None = Field(default=None, description="A built-in voice's name, or a created voice's "
                                          "name or {\"id\": \"voice_...\"}; not needed with ref_audio")
    instructions: Text | None = Field(default=None, max_length=MAX_INPUT_CHARS)
    language: Name | None = Field(default=None, description="auto (the default: detected) or one of the model's "
                                  "languages")
    normalize: bool = Field(default=True, description="Numbers and symbols read out as words in the text's "
                            "language ($3.50, 7:30 pm, 42%); false sends the text as it is")
    response_format: ResponseFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    sample_rate: int | None = Field(default=None, ge=8000, le=48000, description="Output sample rate (default 24000)")
    text_layout: Literal["full", "streaming"] | None = Field(
        default=None, description="How the model takes the text: all of it in the prompt (full), or one token per "
        "codec frame (streaming); the model's own layout when unset")
    ref_audio: Text | None = Field(default=None, description="A recording to clone the voice from, for this request "
                                  "only (Base checkpoints): base64, or a data:audio/...;base64, URL")
    ref_text: Text | None = Field(default=None, min_length=1, max_length=MAX_INPUT_CHARS,
                                  description="ref_audio's words (in-context cloning; without them the voice is cloned "
                                  "from its x-vector alone)")
    timestamps: Literal["word"] | None = Field(
        default=None, description="word: each sentence's words with their times, as speech.audio.timestamps events "
        "(stream_format=sse; the server needs --aligner)")

    @property
    def voice_name(self) -> str | None:
        return self.voice if isinstance(self.voice, str) or self.voice is None else self.voice.id


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(BaseModel):
    error: ErrorDetail


class SpeechUsage(BaseModel):
    """OpenAI's token counts, plus what the audio amounts to."""

    input_tokens: int = Field(description="Text tokens of the input and instructions")
    output_tokens: int = Field(description="Codec frames generated (12.5 per second of audio)")
    total_tokens: int
    audio_seconds: float = Field(description="Seconds of audio sent, after speed")
    samples: int = Field(description="Samples sent, at the output sample rate")


# Server-sent events of `stream_format=sse` -------------------------------------------------------------
class SpeechAudioDelta(BaseModel):
    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str  # base64 of the response_format bytes


class SpeechAudioDone(BaseModel):
    """The end of the audio. `status` is `incomplete` when a limit cut it short (`status_details.reason`)."""

    type: Literal["speech.audio.done"] = "speech.audio.done"
    status: Literal["completed", "incomplete"] = "completed"
    status_details: dict[str, Any] | None = None
    transcript: str | None = None  # the text as spoken (respelled, pauses as tags)
    language: str | None = None  # the language it was spoken in: named, or detected (None: the model's choice)
    usage: SpeechUsage


class WordTime(BaseModel):
    word: str
    start: float  # seconds from the start of the response's audio
    end: float


class SpeechAudioTimestamps(BaseModel):
    """One segment's (sentence's) words and when they are heard, sent once its audio has been sent."""

    type: Literal["speech.audio.timestamps"] = "speech.audio.timestamps"
    segment: int  # 0, 1, ...: the segments of a long text
    text: str  # the segment's text as spoken
    start: float  # the segment's audio: seconds from the start of the response's audio
    end: float
    words: list[WordTime]
    error: str | None = None  # the aligner failed on this segment: it has no words


def timed(ts: Timestamps, speed: float) -> dict[str, Any]:
    """A segment's timestamps as the events carry them: on the output's timeline (the engine's times / speed)."""

    def t(seconds: float) -> float:
        return round(seconds / speed, 3)

    return {"segment": ts.segment, "text": ts.text, "start": t(ts.start), "end": t(ts.end), "error": ts.error,
            "words": [WordTime(word=w, start=t(a), end=t(b)) for w, a, b in ts.words]}


class SpeechError(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail


# Listings ------------------------------------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "talkstream"
    timestamps: bool = Field(default=False, description="Whether it times words (the server runs --aligner)")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceCard(BaseModel):
    id: str
    name: str
    speaker: str | None
    alias_of: str | None = None


class VoiceObject(BaseModel):
    """A created voice, as OpenAI's `Voice`; `prompt` only for designed voices. `model`: the model it speaks with
    (Talkstream's)."""

    id: str
    object: Literal["audio.voice"] = "audio.voice"
    name: str
    type: Literal["audio_sample", "prompt"]
    created_at: int
    prompt: str | None = None
    model: str


class VoiceList(BaseModel):
    """The model's built-in voices (`VoiceCard`), then the voices created for it (`VoiceObject`)."""

    object: Literal["list"] = "list"
    model: str
    data: list[VoiceCard | VoiceObject]
    languages: list[str]


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"
    deleted: bool = True


class VoiceCreate(_Strict):
    """`POST /v1/audio/voices`, as OpenAI's, plus `transcript` (in-context cloning) and `model`. Its `audio_sample`
    file comes beside it in the multipart form."""

    name: Name
    type: Literal["audio_sample", "prompt"] = "audio_sample"
    consent: Name | None = None
    transcript: Text | None = Field(default=None, min_length=1, max_length=MAX_INPUT_CHARS)
    prompt: Text | None = Field(default=None, min_length=1, max_length=MAX_INPUT_CHARS)
    model: Name | None = None
    script_hint: Text | None = None  # OpenAI's preview script: no preview is made here


class VoiceConsentObject(BaseModel):
    id: str
    object: Literal["audio.voice_consent"] = "audio.voice_consent"
    name: str
    language: str
    created_at: int


class VoiceConsentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceConsentObject]
    has_more: bool
    first_id: str | None
    last_id: str | None


class VoiceConsentUpdate(_Strict):
    name: Name


class VoiceConsentDeleted(BaseModel):
    id: str
    object: Literal["audio.voice_consent"] = "audio.voice_consent"  # as the SDK's type has it
    deleted: bool = True


class Health(BaseModel):
    status: str  # ready when every model's engine is
    model: str  # the default model
    detail: str | None = None
    models: dict[str, str] = Field(default_factory=dict)  # each served model's engine state

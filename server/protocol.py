"""Wire models: the speech request, SSE events, Realtime events and the small listing endpoints."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_INPUT_CHARS = 4096
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")

Text = Annotated[str, StringConstraints(strict=True)]
ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class StreamFormat(StrEnum):
    AUDIO = "audio"
    SSE = "sse"


class ResponseStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class VoiceRef(_Strict):
    id: Text


class SamplingFields(_Strict):
    """Talkstream's extensions, shared by the speech request and the Realtime session."""

    seed: int | None = Field(default=None, ge=0, lt=2**63)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, ge=0.5, le=2.0)


class SpeechBody(SamplingFields):
    """`POST /v1/audio/speech`, as in OpenAI's speech API, plus `seed`, `sample_rate` and sampling parameters."""

    model: Text = Field(description="The served model's id, or one of tts-1, tts-1-hd, gpt-4o-mini-tts")
    input: Text = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    voice: Text | VoiceRef
    instructions: Text | None = Field(default=None, max_length=MAX_INPUT_CHARS)
    language: Text | None = Field(default=None, description="auto (the default) or one of the model's languages")
    response_format: ResponseFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    sample_rate: int | None = Field(default=None, ge=8000, le=48000, description="Output sample rate (default 24000)")

    @property
    def voice_name(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice.id


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(BaseModel):
    error: ErrorDetail


# Server-sent events of `stream_format=sse` -------------------------------------------------------------
class SpeechUsage(BaseModel):
    output_tokens: int = Field(description="Codec frames generated")
    audio_seconds: float
    samples: int


class SpeechAudioDelta(BaseModel):
    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str  # base64 of the response_format bytes


class SpeechAudioDone(BaseModel):
    type: Literal["speech.audio.done"] = "speech.audio.done"
    usage: SpeechUsage


class SpeechError(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail


# Listings ------------------------------------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "talkstream"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceCard(BaseModel):
    id: str
    name: str
    speaker: str | None
    alias_of: str | None = None


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceCard]
    languages: list[str]


class Health(BaseModel):
    status: str
    model: str
    detail: str | None = None


# Realtime ------------------------------------------------------------------------------------------------------
class SessionConfig(SamplingFields):
    """The session fields Talkstream uses; other OpenAI session fields are accepted and ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")
    voice: Text | None = None
    instructions: Text | None = Field(default=None, max_length=MAX_INPUT_CHARS)
    language: Text | None = None
    output_audio_format: Literal["pcm16"] = "pcm16"


class _ClientEvent(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    event_id: Text | None = None


class SessionUpdate(_ClientEvent):
    type: Literal["session.update"]
    session: SessionConfig


class TextAppend(_ClientEvent):
    type: Literal["input_text_buffer.append"]
    text: Text = Field(max_length=MAX_INPUT_CHARS)


class TextCommit(_ClientEvent):
    type: Literal["input_text_buffer.commit"]


class TextClear(_ClientEvent):
    type: Literal["input_text_buffer.clear"]


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["input_text", "text"]
    text: Text


class ConversationItem(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["message"] = "message"
    role: Literal["user", "system"] = "user"
    content: list[ContentPart] = Field(min_length=1)


class ItemCreate(_ClientEvent):
    type: Literal["conversation.item.create"]
    item: ConversationItem


class ResponseOptions(SamplingFields):
    model_config = ConfigDict(strict=True, extra="ignore")
    voice: Text | None = None
    instructions: Text | None = Field(default=None, max_length=MAX_INPUT_CHARS)


class ResponseCreate(_ClientEvent):
    type: Literal["response.create"]
    response: ResponseOptions = Field(default_factory=lambda: ResponseOptions())


class ResponseCancel(_ClientEvent):
    type: Literal["response.cancel"]
    response_id: Text | None = None


ClientEvent = Annotated[
    SessionUpdate | TextAppend | TextCommit | TextClear | ItemCreate | ResponseCreate | ResponseCancel,
    Field(discriminator="type"),
]


class ClientEventAdapter(BaseModel):
    event: ClientEvent


class RealtimeSession(SessionConfig):
    model_config = ConfigDict(extra="forbid")
    id: str
    object: Literal["realtime.session"] = "realtime.session"
    model: str
    sample_rate: int = 24000


class RealtimeResponse(BaseModel):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: ResponseStatus
    status_details: dict[str, Any] | None = None
    usage: SpeechUsage | None = None


class _ServerEvent(BaseModel):
    event_id: str


class SessionEvent(_ServerEvent):
    type: Literal["session.created", "session.updated"]
    session: RealtimeSession


class ResponseEvent(_ServerEvent):
    type: Literal["response.created", "response.done"]
    response: RealtimeResponse


class AudioDelta(_ServerEvent):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str  # base64 of s16le mono PCM at the session's sample rate


class AudioDone(_ServerEvent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class RealtimeErrorDetail(ErrorDetail):
    event_id: str | None = None  # the client event it answers


class ErrorEvent(_ServerEvent):
    type: Literal["error"] = "error"
    error: RealtimeErrorDetail


ServerEvent = SessionEvent | ResponseEvent | AudioDelta | AudioDone | ErrorEvent

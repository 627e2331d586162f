"""Wire models of `WS /v1/realtime`: the TTS subset of OpenAI's Realtime protocol.

Sessions accept OpenAI's GA shape (`session.audio.output.voice`, `output_modalities`, `max_output_tokens`) and the
beta one (`session.voice`, `modalities`, `max_response_output_tokens`). What a text-to-speech server cannot honour
(tools, turn detection, input audio settings, unknown fields) is not dropped silently: `unsupported()` names it and
the session tells the client in an `error` event. Server events follow the GA event sequence, so every id a client
sees was announced first (see server/realtime/response.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from server.protocol import (
    MAX_INPUT_CHARS,
    ErrorDetail,
    Name,
    ResponseStatus,
    SamplingFields,
    SpeechUsage,
    Text,
    VoiceRef,
    WordTime,
)

PCM_RATE = 24000
TextLayoutName = Literal["full", "streaming"]
Tokens = Annotated[int, Field(ge=1, le=2**31 - 1)] | Literal["inf"]  # OpenAI's output token limit; codec frames here
# OpenAI session fields about input audio, tools and tracing: accepted while empty, reported when set
_UNSUPPORTED = ("input_audio_format", "input_audio_transcription", "input_audio_noise_reduction", "turn_detection",
                "tools", "tool_choice", "include", "prompt", "tracing", "truncation", "parallel_tool_calls",
                "reasoning", "conversation", "input", "metadata")


class _Open(BaseModel):
    """OpenAI objects: known fields are typed; others are kept so that they can be reported, not dropped."""

    model_config = ConfigDict(strict=True, extra="allow")


class PcmFormat(_Open):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class AudioOutput(_Open):
    voice: Name | VoiceRef | None = None  # a created voice as {"id": "voice_..."} too
    format: PcmFormat | None = None
    speed: float | None = Field(default=None, ge=0.25, le=4.0)


class AudioConfig(_Open):
    output: AudioOutput | None = None
    input: Any = None


class OutputOptions(SamplingFields, _Open):
    """What a session and a response both set: the GA and beta spellings of voice, instructions and limits."""

    model_config = ConfigDict(strict=True, extra="allow")
    audio: AudioConfig | None = None
    voice: Name | VoiceRef | None = None
    instructions: Text | None = Field(default=None, max_length=MAX_INPUT_CHARS)
    language: Name | None = None
    speed: float | None = Field(default=None, ge=0.25, le=4.0)
    output_modalities: list[Literal["audio", "text"]] | None = None
    modalities: list[Literal["audio", "text"]] | None = None
    output_audio_format: Literal["pcm16"] | None = None
    max_output_tokens: Tokens | None = None
    max_response_output_tokens: Tokens | None = None
    text_layout: TextLayoutName | None = None  # Talkstream's: how the text is fed (the model's own when unset)
    normalize: bool | None = None  # Talkstream's: numbers and symbols as words (on when unset)
    timestamps: Literal["word"] | None = None  # Talkstream's: each segment's words (response.output_audio.timestamps)

    def settings(self) -> dict[str, Any]:
        """The fields set, in one spelling (the GA one wins where both are given)."""
        out = self.audio.output if self.audio is not None and self.audio.output is not None else AudioOutput()
        values = {
            "voice": _voice_name(out.voice or self.voice), "speed": out.speed or self.speed,
            "instructions": self.instructions, "language": self.language, "text_layout": self.text_layout,
            "normalize": self.normalize, "timestamps": self.timestamps,
            "max_output_tokens": self.max_output_tokens if self.max_output_tokens is not None
            else self.max_response_output_tokens,
            **{k: getattr(self, k) for k in SamplingFields.model_fields},
        }
        return {k: v for k, v in values.items() if v is not None}

    def unsupported(self) -> list[str]:
        """Fields set that change nothing here: unknown ones, and OpenAI's input, tool and tracing settings."""
        found = [k for k, v in (self.model_extra or {}).items() if k not in _UNSUPPORTED or _set(v)]
        if self.audio is not None:
            found += [f"audio.{k}" for k, v in (self.audio.model_extra or {}).items()]
            found += ["audio.input"] if _set(self.audio.input) else []
        modalities = self.output_modalities or self.modalities
        if modalities is not None and "audio" not in modalities:
            found.append("output_modalities")
        return found


def _voice_name(voice: str | VoiceRef | None) -> str | None:
    return voice.id if isinstance(voice, VoiceRef) else voice


def _set(value: Any) -> bool:
    return value not in (None, [], {}, "", "none", "auto", "disabled")


class SessionOptions(OutputOptions):
    type: Literal["realtime"] | None = None
    model: Name | None = None
    text_streaming: bool | None = None  # Talkstream's: the first append starts a response that later ones feed

    def settings(self) -> dict[str, Any]:
        extra = {"text_streaming": self.text_streaming} if self.text_streaming is not None else {}
        return super().settings() | extra


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["input_text", "text"]
    text: Text


class ConversationItem(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    id: Name | None = None
    type: Literal["message"] = "message"
    role: Literal["user", "system"] = "user"
    content: list[ContentPart] = Field(min_length=1)


# Client events --------------------------------------------------------------------------------------------------
class _ClientEvent(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    event_id: Text | None = None


class SessionUpdate(_ClientEvent):
    type: Literal["session.update"]
    session: SessionOptions


class TextAppend(_ClientEvent):
    type: Literal["input_text_buffer.append"]
    text: Text = Field(max_length=MAX_INPUT_CHARS)


class TextCommit(_ClientEvent):
    type: Literal["input_text_buffer.commit"]


class TextClear(_ClientEvent):
    type: Literal["input_text_buffer.clear"]


class ItemCreate(_ClientEvent):
    type: Literal["conversation.item.create"]
    item: ConversationItem
    previous_item_id: Text | None = None


class ResponseCreate(_ClientEvent):
    type: Literal["response.create"]
    response: OutputOptions = Field(default_factory=lambda: OutputOptions())


class ResponseCancel(_ClientEvent):
    type: Literal["response.cancel"]
    response_id: Text | None = None


ClientEvent = Annotated[
    SessionUpdate | TextAppend | TextCommit | TextClear | ItemCreate | ResponseCreate | ResponseCancel,
    Field(discriminator="type"),
]


# Server objects --------------------------------------------------------------------------------------------------
class OutputFormat(BaseModel):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: int = PCM_RATE


class AudioOut(BaseModel):
    format: OutputFormat = Field(default_factory=OutputFormat)
    voice: str | None = None
    speed: float = 1.0


class AudioSection(BaseModel):
    output: AudioOut


class RealtimeSession(SamplingFields):
    """The session as `session.created` / `session.updated` show it: GA fields, then the beta spellings."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str
    model: str
    output_modalities: list[str] = Field(default_factory=lambda: ["audio"])
    instructions: str | None = None
    max_output_tokens: Tokens = "inf"
    audio: AudioSection
    language: str | None = None
    voice: str | None = None
    output_audio_format: Literal["pcm16"] = "pcm16"
    sample_rate: int = PCM_RATE
    text_streaming: bool = False
    text_layout: TextLayoutName | None = None
    normalize: bool = True
    timestamps: Literal["word"] | None = None


class ContentOut(BaseModel):
    type: Literal["output_audio", "input_text"]
    transcript: str | None = None
    text: str | None = None


class PartOut(BaseModel):
    """A content part as its own events show it (the item's content calls the same part `output_audio`)."""

    type: Literal["audio"] = "audio"
    transcript: str


class MessageItem(BaseModel):
    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["message"] = "message"
    role: Literal["assistant", "user", "system"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ContentOut]


class TokenDetails(BaseModel):
    text_tokens: int = 0
    audio_tokens: int = 0
    cached_tokens: int | None = None


class RealtimeUsage(SpeechUsage):
    input_token_details: TokenDetails
    output_token_details: TokenDetails


class RealtimeResponse(BaseModel):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: ResponseStatus
    status_details: dict[str, Any] | None = None
    output: list[MessageItem] = Field(default_factory=list)
    output_modalities: list[str] = Field(default_factory=lambda: ["audio"])
    max_output_tokens: Tokens = "inf"
    audio: AudioSection
    conversation_id: str
    usage: RealtimeUsage | None = None
    metadata: dict[str, str] | None = None  # Talkstream's: the language it was spoken in (named, or detected)


# Server events --------------------------------------------------------------------------------------------------
class _ServerEvent(BaseModel):
    event_id: str


class SessionEvent(_ServerEvent):
    type: Literal["session.created", "session.updated"]
    session: RealtimeSession


class ResponseEvent(_ServerEvent):
    type: Literal["response.created", "response.done"]
    response: RealtimeResponse


class ConversationItemEvent(_ServerEvent):
    type: Literal["conversation.item.added", "conversation.item.done"]
    previous_item_id: str | None = None
    item: MessageItem


class OutputItemEvent(_ServerEvent):
    type: Literal["response.output_item.added", "response.output_item.done"]
    response_id: str
    output_index: int = 0
    item: MessageItem


class _PartEvent(_ServerEvent):
    """An event about the response's one content part."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ContentPartEvent(_PartEvent):
    type: Literal["response.content_part.added", "response.content_part.done"]
    part: PartOut


class AudioDelta(_PartEvent):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str  # base64 of s16le mono PCM at 24 kHz


class AudioDone(_PartEvent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class WordTimes(_PartEvent):
    """Talkstream's: one segment's words, once its audio has been sent (seconds from the response's first audio)."""

    type: Literal["response.output_audio.timestamps"] = "response.output_audio.timestamps"
    segment: int
    text: str
    start: float
    end: float
    words: list[WordTime]
    error: str | None = None


class TranscriptDone(_PartEvent):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class RealtimeErrorDetail(ErrorDetail):
    event_id: str | None = None  # the client event it answers


class ErrorEvent(_ServerEvent):
    type: Literal["error"] = "error"
    error: RealtimeErrorDetail


ServerEvent = (SessionEvent | ResponseEvent | ConversationItemEvent | OutputItemEvent | ContentPartEvent
               | AudioDelta | AudioDone | WordTimes | TranscriptDone | ErrorEvent)

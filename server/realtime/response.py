"""One Realtime response: its audio and the GA event sequence around it, so every id a client sees was announced:

    response.created → response.output_item.added → conversation.item.added → response.content_part.added
    → response.output_audio.delta … → response.output_audio.done → response.output_audio_transcript.done

(with Talkstream's `timestamps`, each segment's `response.output_audio.timestamps` among the deltas, after its audio)
    → response.content_part.done → response.output_item.done → conversation.item.done → response.done

`response.done` says how it ended, as OpenAI does: `completed`; `incomplete` when a limit cut it
(`status_details.reason` `max_output_tokens`: the client's limit, or a segment of a long text the model did not
finish within the server's frame cap; a guard against runaway audio, with its own reason as `cause`:
`max_speech_length` or `repetition`, server/protocol.py); `cancelled` (`client_cancelled`); `failed` with the error.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from engine import AudioStream, FinishReason, SpeechInput, Timestamps
from server.audio.transcode import AsyncTranscoder
from server.protocol import ResponseStatus, incomplete, timed
from server.realtime.protocol import (
    AudioDelta,
    AudioDone,
    AudioOut,
    AudioSection,
    ContentOut,
    ContentPartEvent,
    ConversationItemEvent,
    MessageItem,
    OutputItemEvent,
    PartOut,
    RealtimeResponse,
    RealtimeUsage,
    ResponseEvent,
    ServerEvent,
    TokenDetails,
    TranscriptDone,
    WordTimes,
)

EventId = Callable[[], str]


def outcome(reason: FinishReason | None) -> tuple[ResponseStatus, dict[str, Any] | None]:
    """How an ended stream reads in OpenAI's terms (a failure's details carry its error; see `failed`)."""
    match reason:
        case FinishReason.EOS:
            return ResponseStatus.COMPLETED, None
        case FinishReason.MAX_FRAMES | FinishReason.SPEECH_CAP | FinishReason.REPETITION:
            return ResponseStatus.INCOMPLETE, incomplete(reason, realtime=True)
        case FinishReason.ERROR:
            return ResponseStatus.FAILED, {"type": "failed"}
        case _:
            return ResponseStatus.CANCELLED, {"type": "cancelled", "reason": "client_cancelled"}


def failed(error: dict[str, Any]) -> dict[str, Any]:
    return {"type": "failed", "error": error}


@dataclass(eq=False)
class ActiveResponse:
    stream: AudioStream
    out: AsyncTranscoder  # PCM at 24 kHz, time-stretched when the session's speed is not 1
    transcript: str  # the text it was asked to speak
    voice: str | None
    speed: float
    max_output_tokens: int | Literal["inf"]
    conversation_id: str
    previous_item_id: str | None
    feed: SpeechInput | None = None  # a text still arriving: the transcript is what has come

    def __post_init__(self) -> None:
        self.id = f"resp_{uuid.uuid4().hex[:20]}"
        self.item_id = f"item_{uuid.uuid4().hex[:20]}"
        self.task: Any = None  # the asyncio task streaming it

    @property
    def text(self) -> str:
        """Its transcript: the text as spoken (respelled), else as it came."""
        if self.feed is not None:
            return self.feed.text
        return self.stream.transcript if self.stream.transcript is not None else self.transcript

    # Objects ------------------------------------------------------------------------------------------------------
    def item(self, status: ResponseStatus | None) -> MessageItem:
        state = {None: "in_progress", ResponseStatus.COMPLETED: "completed"}.get(status, "incomplete")
        content = [ContentOut(type="output_audio", transcript=self.text if status else None)]
        return MessageItem(id=self.item_id, role="assistant", status=state, content=content)  # type: ignore[arg-type]

    def response(self, status: ResponseStatus | None = None, details: dict[str, Any] | None = None) -> RealtimeResponse:
        audio = AudioSection(output=AudioOut(voice=self.voice, speed=self.speed))
        return RealtimeResponse(
            id=self.id, status=status or ResponseStatus.IN_PROGRESS, status_details=details,
            output=[self.item(status)] if status else [], max_output_tokens=self.max_output_tokens, audio=audio,
            conversation_id=self.conversation_id, usage=self.usage() if status else None,
            metadata={"language": self.stream.language} if status and self.stream.language else None)

    def usage(self) -> RealtimeUsage:
        u = self.stream.usage
        samples = self.out.samples
        return RealtimeUsage(
            input_tokens=u.input_tokens, output_tokens=u.frames, total_tokens=u.input_tokens + u.frames,
            audio_seconds=round(samples / u.sample_rate, 4), samples=samples,
            input_token_details=TokenDetails(text_tokens=u.input_tokens, cached_tokens=0),
            output_token_details=TokenDetails(audio_tokens=u.frames))

    # Events -------------------------------------------------------------------------------------------------------
    def opening(self, eid: EventId) -> list[ServerEvent]:
        item = self.item(None)
        part = PartOut(transcript="")
        return [
            ResponseEvent(type="response.created", event_id=eid(), response=self.response()),
            OutputItemEvent(type="response.output_item.added", event_id=eid(), response_id=self.id, item=item),
            ConversationItemEvent(type="conversation.item.added", event_id=eid(), item=item,
                                  previous_item_id=self.previous_item_id),
            ContentPartEvent(type="response.content_part.added", event_id=eid(), response_id=self.id,
                             item_id=self.item_id, part=part),
        ]

    def timestamps(self, eid: EventId, ts: Timestamps) -> WordTimes:
        return WordTimes(event_id=eid(), response_id=self.id, item_id=self.item_id, **timed(ts, self.speed))

    def delta(self, eid: EventId, data: bytes) -> AudioDelta:
        return AudioDelta(event_id=eid(), response_id=self.id, item_id=self.item_id,
                          delta=base64.b64encode(data).decode())

    def closing(self, eid: EventId, status: ResponseStatus, details: dict[str, Any] | None) -> list[ServerEvent]:
        item, rid, iid = self.item(status), self.id, self.item_id
        part = PartOut(transcript=self.text)
        return [
            AudioDone(event_id=eid(), response_id=rid, item_id=iid),
            TranscriptDone(event_id=eid(), transcript=self.text, response_id=rid, item_id=iid),
            ContentPartEvent(type="response.content_part.done", event_id=eid(), part=part, response_id=rid,
                             item_id=iid),
            OutputItemEvent(type="response.output_item.done", event_id=eid(), response_id=self.id, item=item),
            ConversationItemEvent(type="conversation.item.done", event_id=eid(), item=item,
                                  previous_item_id=self.previous_item_id),
            ResponseEvent(type="response.done", event_id=eid(), response=self.response(status, details)),
        ]


"""`WS /v1/realtime`: the text-to-speech subset of OpenAI's Realtime protocol.

One response at a time per socket; responses run in sequence. Errors are `error` events and never end the
session; a disconnect cancels the response in flight. On shutdown (server/drain.py) new sessions are refused with
503, idle ones are closed with 1012 and busy ones once their response is done (or cut at the shutdown timeout).
A client that stops reading has its connection aborted once a send outlasts `reader_timeout_s`.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import uuid
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter, ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from output_builder.streams import AudioStream
from server import errors
from server.http_protocol import abort_of
from server.protocol import (
    AudioDelta,
    AudioDone,
    ClientEvent,
    ErrorEvent,
    ItemCreate,
    RealtimeErrorDetail,
    RealtimeResponse,
    RealtimeSession,
    ResponseCancel,
    ResponseCreate,
    ResponseEvent,
    ResponseOptions,
    ResponseStatus,
    ServerEvent,
    SessionConfig,
    SessionEvent,
    SessionUpdate,
    SpeechUsage,
    TextAppend,
    TextClear,
    TextCommit,
)
from server.state import ServerState, authorize, server_state
from talker.request import FinishReason, SpeechRequest

log = logging.getLogger("talkstream.realtime")
router = APIRouter()
PROTOCOL = "ws"
MAX_EVENT_CHARS = 64 * 1024  # one event; 4096 characters of text fit many times over
MAX_BUFFER_CHARS = 4096  # the input text buffer and pending items, as for `input` over HTTP
MAX_RESPONSES_PER_SESSION = 1000
CLOSE_TIMEOUT_S = 2.0  # a close frame that cannot be sent in this time (the peer is not reading): abort instead
SERVICE_RESTART = 1012
_events: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)


@router.websocket("/realtime")
async def realtime(ws: WebSocket) -> None:
    state = server_state(ws)
    try:
        await authorize(ws)
        if state.draining:
            raise errors.shutting_down()
    except errors.ApiError as err:
        state.metrics.error(err.detail.type, err.detail.code)
        await deny(ws, err, SERVICE_RESTART if err.status == 503 else 1008)
        return
    await ws.accept()
    await Session(ws, state).run()


async def deny(ws: WebSocket, err: errors.ApiError, close_code: int = 1008) -> None:
    """An HTTP error instead of the upgrade where the server supports it, else a close (policy violation)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(JSONResponse({"error": err.detail.model_dump()}, status_code=err.status,
                                                   headers=err.headers))
    else:
        await ws.close(code=close_code, reason=err.detail.message[:120])


class ActiveResponse:
    def __init__(self, stream: AudioStream) -> None:
        self.id = f"resp_{uuid.uuid4().hex[:20]}"
        self.item_id = f"item_{uuid.uuid4().hex[:20]}"
        self.stream = stream
        self.task: asyncio.Task[None] | None = None


class Session:
    def __init__(self, ws: WebSocket, state: ServerState) -> None:
        self.ws, self.state = ws, state
        self.id = f"sess_{uuid.uuid4().hex[:20]}"
        self.config = SessionConfig()
        self.text_buffer: list[str] = []
        self.pending_items: list[str] = []
        self.active: ActiveResponse | None = None
        self._event_ids = itertools.count(1)
        self.responses = 0
        self._send_lock = asyncio.Lock()
        self._stalled = False  # a send timed out: the client stopped reading, nothing more is sent
        self._closing = False

    # Transport --------------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.send(SessionEvent(type="session.created", event_id=self._eid(), session=self._session()))
        self.state.metrics.sessions.inc()
        self.state.sessions.add(self)
        try:
            if self.state.draining:  # began while this session was being accepted
                await self.drain()
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self.handle(message.get("text"))
        finally:
            self.state.sessions.discard(self)
            self.state.metrics.sessions.dec()
            await self._abandon()

    async def send(self, event: ServerEvent) -> bool:
        if self.ws.client_state is not WebSocketState.CONNECTED or self._closing:
            return False
        async with self._send_lock:
            if self._stalled:
                return False
            try:
                await asyncio.wait_for(self.ws.send_text(event.model_dump_json(exclude_none=True)),
                                       self.state.engine.config.reader_timeout_s)
            except TimeoutError:  # the peer stopped reading: free the engine side, then the connection itself
                log.warning("realtime session %s: the client stopped reading; dropping it", self.id)
                self._stalled = True
                if self.active is not None:
                    self.active.stream.cancel()
                self.abort()
                return False
            except (RuntimeError, OSError, WebSocketDisconnect) as exc:  # the peer is gone; the receive loop sees it
                log.debug("realtime send failed: %r", exc)
                return False
        return True

    async def error(self, err: errors.ApiError, event_id: str | None = None) -> None:
        self.state.metrics.error(err.detail.type, err.detail.code)
        detail = RealtimeErrorDetail(**err.detail.model_dump(), event_id=event_id)
        await self.send(ErrorEvent(event_id=self._eid(), error=detail))

    def abort(self) -> None:
        """Drops the connection at once, unsent data included (for a peer that stopped reading). The receive
        loop then sees the disconnect and ends the session."""
        abort = abort_of(self.ws.scope)
        if abort is not None:
            abort()

    async def close(self, code: int = SERVICE_RESTART, reason: str = "server shutting down") -> None:
        """Idempotent. A close frame that cannot leave within CLOSE_TIMEOUT_S aborts the connection instead."""
        if self._closing:
            return
        self._closing = True
        if self._stalled:
            self.abort()
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S), self._send_lock:
                await self.ws.close(code, reason)
        except TimeoutError:
            self.abort()
        except (RuntimeError, OSError, WebSocketDisconnect) as exc:  # already closed, or the peer is gone
            log.debug("realtime close failed: %r", exc)

    # Shutdown (server/drain.py) -----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.active is not None

    async def drain(self) -> None:
        """An idle session closes now (1012); a busy one once its response is done (see `_done`)."""
        if self.active is None:
            await self.close()

    async def cut(self, err: errors.ApiError) -> None:
        """The shutdown timeout passed: end the response in flight (`response.done` failed), then close."""
        active = self.active
        if active is not None:
            active.stream.cancel()
            if active.task is not None:
                active.task.cancel()
                await asyncio.gather(active.task, return_exceptions=True)
            await self._done(active, ResponseStatus.FAILED, {"type": "failed", "error": err.detail.model_dump()})
        await self.close()

    def _eid(self) -> str:
        return f"event_{next(self._event_ids)}"

    def _session(self) -> RealtimeSession:
        return RealtimeSession(**self.config.model_dump(), id=self.id, model=self.state.engine.model_id,
                               sample_rate=self.state.engine.sample_rate)

    # Client events ------------------------------------------------------------------------------------
    async def handle(self, text: str | None) -> None:
        if text is None:
            await self.error(errors.invalid("binary frames are not supported; send JSON text events",
                                            code="invalid_event"))
            return
        if len(text) > MAX_EVENT_CHARS:
            await self.error(errors.invalid(f"the event is larger than {MAX_EVENT_CHARS} characters",
                                            code="event_too_large"))
            return
        try:
            event = _events.validate_python(json.loads(text))
        except json.JSONDecodeError as exc:
            await self.error(errors.invalid(f"the event is not valid JSON: {exc}", code="invalid_json"))
            return
        except ValidationError as exc:
            await self.error(event_error(exc), _event_id_of(text))
            return
        try:
            await self.dispatch(event)
        except errors.ApiError as err:
            await self.error(err, event.event_id)

    async def dispatch(self, event: ClientEvent) -> None:
        match event:
            case SessionUpdate():
                self._check_voice(event.session.voice, "session.voice")
                self.config = self.config.model_copy(update=event.session.model_dump(exclude_unset=True))
                await self.send(SessionEvent(type="session.updated", event_id=self._eid(), session=self._session()))
            case TextAppend():
                self._check_room(self.text_buffer, event.text)
                self.text_buffer.append(event.text)
            case TextClear():
                self.text_buffer.clear()
            case TextCommit():
                self._require_idle()
                text = "".join(self.text_buffer)
                if not text.strip():
                    raise errors.invalid("the input text buffer is empty", code="input_text_buffer_empty")
                await self.respond(text, ResponseOptions())
                self.text_buffer.clear()
            case ItemCreate():
                text = " ".join(part.text for part in event.item.content)
                self._check_room(self.pending_items, text)
                self.pending_items.append(text)
            case ResponseCreate():
                self._require_idle()
                text = " ".join(self.pending_items)
                if not text.strip():
                    raise errors.invalid("no input: send conversation.item.create with input_text first",
                                         code="no_input")
                await self.respond(text, event.response)
                self.pending_items.clear()
            case ResponseCancel():
                self.cancel(event.response_id)

    def _check_voice(self, voice: str | None, param: str) -> None:
        voices = self.state.engine.voices
        if voice is not None and voices and voice.lower() not in voices:
            raise errors.invalid(f"unknown voice '{voice}'; available voices: {', '.join(sorted(voices))}",
                                 param, "invalid_value")

    @staticmethod
    def _check_room(buffer: list[str], text: str) -> None:
        if sum(map(len, buffer)) + len(buffer) + len(text) > MAX_BUFFER_CHARS:
            raise errors.invalid(f"the input text would exceed {MAX_BUFFER_CHARS} characters; commit or clear it",
                                 "text", "input_text_buffer_full")

    def _require_idle(self) -> None:
        if self.active is not None:
            raise errors.invalid(f"response {self.active.id} is still in progress",
                                 code="conversation_already_has_active_response")

    def cancel(self, response_id: str | None) -> None:
        active = self.active
        if active is None or (response_id is not None and response_id != active.id):
            raise errors.invalid("there is no active response to cancel", "response_id", "response_cancel_not_active")
        active.stream.cancel()

    # Responses ----------------------------------------------------------------------------------------------
    async def respond(self, text: str, options: ResponseOptions) -> None:
        self._check_voice(options.voice, "response.voice")
        if self.responses >= MAX_RESPONSES_PER_SESSION:
            raise errors.invalid(f"a session may create at most {MAX_RESPONSES_PER_SESSION} responses; open a new one",
                                 code="session_response_limit")
        cfg = self.config.model_copy(update=options.model_dump(exclude_none=True))
        request = SpeechRequest(text=text, voice=cfg.voice, language=cfg.language, instructions=cfg.instructions,
                                seed=cfg.seed, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                repetition_penalty=cfg.repetition_penalty)
        try:
            stream = self.state.engine.submit(request)
        except Exception as exc:
            raise errors.from_exception(exc) from exc
        self.responses += 1
        self.active = active = ActiveResponse(stream)
        created = RealtimeResponse(id=active.id, status=ResponseStatus.IN_PROGRESS)
        await self.send(ResponseEvent(type="response.created", event_id=self._eid(), response=created))
        active.task = asyncio.create_task(self._stream(active), name=f"realtime-{active.id}")
        open_responses = self.state.metrics.open_responses.labels(PROTOCOL)
        open_responses.inc()
        active.task.add_done_callback(lambda _: open_responses.dec())  # also when cancelled before it ran

    async def _stream(self, active: ActiveResponse) -> None:
        stream = active.stream
        first = True
        try:
            async for pcm in stream:
                if first:
                    self.state.metrics.first_audio(PROTOCOL, stream.time_to_first_audio)
                    first = False
                delta = base64.b64encode(pcm.astype("<i2", copy=False).tobytes()).decode()
                await self.send(AudioDelta(event_id=self._eid(), response_id=active.id, item_id=active.item_id,
                                           delta=delta))
            await self.send(AudioDone(event_id=self._eid(), response_id=active.id, item_id=active.item_id))
            cancelled = stream.finish_reason is FinishReason.CANCELLED
            await self._done(active, ResponseStatus.CANCELLED if cancelled else ResponseStatus.COMPLETED)
        except asyncio.CancelledError:
            stream.cancel()
            raise
        except Exception as exc:
            err = errors.from_exception(exc)
            log.warning("realtime response %s failed: %s", active.id, exc)
            self.state.metrics.error(err.detail.type, err.detail.code)
            stream.cancel()
            await self._done(active, ResponseStatus.FAILED, {"type": "failed", "error": err.detail.model_dump()})
        finally:
            if self.active is active:
                self.active = None
            reason = stream.finish_reason or FinishReason.CANCELLED
            self.state.metrics.finished(PROTOCOL, reason.value, stream.usage.audio_seconds)

    async def _done(
        self, active: ActiveResponse, status: ResponseStatus, details: dict[str, Any] | None = None,
    ) -> None:
        u = active.stream.usage
        usage = SpeechUsage(output_tokens=u.frames, audio_seconds=round(u.audio_seconds, 4), samples=u.samples)
        response = RealtimeResponse(id=active.id, status=status, status_details=details, usage=usage)
        self.active = None
        await self.send(ResponseEvent(type="response.done", event_id=self._eid(), response=response))
        if self.state.draining:
            await self.close()

    async def _abandon(self) -> None:
        active, self.active = self.active, None
        if active is None:
            return
        active.stream.cancel()
        if active.task is not None:
            active.task.cancel()
            await asyncio.gather(active.task, return_exceptions=True)


def event_error(exc: ValidationError) -> errors.ApiError:
    first = exc.errors()[0]
    kind, loc = first["type"], [str(p) for p in first["loc"]]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return errors.invalid(f"unknown or missing event type: {first['msg']}", "type", "unknown_event")
    param = ".".join(loc[1:]) or None
    return errors.invalid(f"{param or 'event'}: {first['msg']}", param, "invalid_event")


def _event_id_of(text: str) -> str | None:
    try:
        value = json.loads(text).get("event_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None

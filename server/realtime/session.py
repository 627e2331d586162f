"""One Realtime session: its settings, its one response at a time, and every event it sends and receives (the
route that opens it is server/realtime/routes.py). An `error` event never ends it."""


from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from engine import (
    MAX_TEXT_S,
    MIN_TEXT_RATE,
    Engine,
    FinishReason,
    SpeechInput,
    SpeechRequest,
    StreamingSpeechRequest,
    TextEnd,
    Timestamps,
)
from server import errors
from server.audio.encoders import AudioFormat
from server.audio.transcode import AsyncTranscoder, Transcoder
from server.http_protocol import abort_of
from server.protocol import ResponseStatus
from server.realtime.events import EventError, parse_event
from server.realtime.input import InputText, check_room
from server.realtime.protocol import (
    AudioOut,
    AudioSection,
    ClientEvent,
    ContentOut,
    ConversationItemEvent,
    ErrorEvent,
    ItemCreate,
    MessageItem,
    OutputOptions,
    RealtimeErrorDetail,
    RealtimeSession,
    ResponseCancel,
    ResponseCreate,
    ServerEvent,
    SessionEvent,
    SessionUpdate,
    TextAppend,
    TextClear,
    TextCommit,
)
from server.realtime.response import ActiveResponse, failed, outcome
from server.state import ServerState
from server.voices import library as voice_library
from server.voices.library import VoiceChoice

log = logging.getLogger("talkstream.realtime")
PROTOCOL = "ws"
MAX_RESPONSES_PER_SESSION = 1000
CLOSE_TIMEOUT_S = 2.0  # a close frame that cannot be sent in this time (the peer is not reading): abort instead
SERVICE_RESTART = 1012


class Session:
    def __init__(self, ws: WebSocket, state: ServerState) -> None:
        self.ws, self.state = ws, state
        self.engine = state.engine  # the default model until a session.update names another
        self.id = f"sess_{uuid.uuid4().hex[:20]}"
        self.conversation_id = f"conv_{uuid.uuid4().hex[:20]}"
        self.settings: dict[str, Any] = {}  # OutputOptions.settings() of every session.update, merged
        self.input = InputText(self)
        self._tasks: set[asyncio.Task[None]] = set()  # events sent from outside a client event (a quiet text's)
        self.pending_items: list[str] = []
        self.last_item_id: str | None = None
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
        try:
            text = event.model_dump_json(exclude_none=True)
        except ValueError:  # text that cannot be encoded (validation keeps it out; this keeps the session alive)
            log.exception("realtime session %s: an event could not be encoded", self.id)
            text = ErrorEvent(event_id=self._eid(), error=RealtimeErrorDetail(
                message="internal error: an event could not be encoded", type="server_error",
                code="internal_error")).model_dump_json(exclude_none=True)
        async with self._send_lock:
            if self._stalled:
                return False
            try:
                await asyncio.wait_for(self.ws.send_text(text), self.state.engine.config.reader_timeout_s)
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

    async def send_all(self, events: list[ServerEvent]) -> None:
        for event in events:
            await self.send(event)

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
            await self._done(active, ResponseStatus.FAILED, failed(err.detail.model_dump()))
        await self.close()

    def _eid(self) -> str:
        return f"event_{next(self._event_ids)}"

    def _session(self) -> RealtimeSession:
        s, engine = self.settings, self.engine
        audio = AudioSection(output=AudioOut(voice=s.get("voice"), speed=s.get("speed", 1.0)))
        sampling = {k: s[k] for k in ("seed", "temperature", "top_k", "top_p", "repetition_penalty") if k in s}
        return RealtimeSession(id=self.id, model=engine.model_id, instructions=s.get("instructions"),
                               max_output_tokens=s.get("max_output_tokens", "inf"), audio=audio,
                               language=s.get("language"), voice=s.get("voice"), sample_rate=engine.sample_rate,
                               text_streaming=bool(s.get("text_streaming")), text_layout=s.get("text_layout"),
                               normalize=s.get("normalize", True), timestamps=s.get("timestamps"), **sampling)

    # Client events ------------------------------------------------------------------------------------
    async def handle(self, text: str | None) -> None:
        """One client event. Whatever it holds, the answer is at most an `error` event."""
        try:
            event = parse_event(text)
        except EventError as exc:
            await self.error(exc.error, exc.event_id)
            return
        try:
            await self.dispatch(event)
        except errors.ApiError as err:
            await self.error(err, event.event_id)
        except Exception:
            log.exception("realtime session %s: event %s failed", self.id, event.type)
            await self.error(errors.internal("internal error while handling the event"), event.event_id)

    async def dispatch(self, event: ClientEvent) -> None:
        match event:
            case SessionUpdate():
                settings = event.session.settings()
                model = event.session.model  # the model this session's responses use
                engine = self.engine if model is None else self.state.engine_for(model)
                await self._voice(settings.get("voice"), "session.voice", engine)
                self.engine = engine
                self.settings.update(settings)
                await self.send(SessionEvent(type="session.updated", event_id=self._eid(), session=self._session()))
                await self._report_unsupported(event.session, "session", event.event_id)
            case TextAppend():
                await self.input.append(event.text)
            case TextClear():
                self.input.clear()
            case TextCommit():
                await self.input.commit()
            case ItemCreate():
                await self.add_item(event)
            case ResponseCreate():
                await self.create_response(event)
            case ResponseCancel():
                self.cancel(event.response_id)

    def _text_ended(self, why: TextEnd) -> None:
        """The engine ended a streaming text that went quiet, came too slowly or was open too long (on the event
        loop, from its watchdog)."""
        timeout = self.engine.config.text_timeout_s
        cause, code = {
            TextEnd.QUIET: (f"no text came for {timeout:g} s", "input_text_timeout"),
            TextEnd.SLOW: (f"the text came slower than {MIN_TEXT_RATE:g} visible character a second",
                           "input_text_too_slow"),
            TextEnd.EXPIRED: (f"the text was open for {MAX_TEXT_S:g} s, the most a streamed text may be",
                              "input_text_expired"),
        }[why]
        err = errors.invalid(f"{cause}: the response's text was ended as if committed", "text", code)
        task = asyncio.get_running_loop().create_task(self.error(err))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def add_item(self, event: ItemCreate) -> None:
        text = " ".join(part.text for part in event.item.content)
        check_room(self.pending_items, text)
        self.pending_items.append(text)
        item = MessageItem(id=event.item.id or f"item_{uuid.uuid4().hex[:20]}", role=event.item.role,
                           status="completed", content=[ContentOut(type="input_text", text=text)])
        previous, self.last_item_id = event.previous_item_id or self.last_item_id, item.id
        for kind in ("conversation.item.added", "conversation.item.done"):
            await self.send(ConversationItemEvent(type=kind, event_id=self._eid(), item=item,
                                                  previous_item_id=previous))

    async def create_response(self, event: ResponseCreate) -> None:
        self.require_idle()
        unsupported = event.response.unsupported()
        if "input" in unsupported:  # out-of-band input would make it speak something other than was asked
            raise errors.invalid("response.input is not supported: add the text with conversation.item.create",
                                 "response.input", "unsupported_field")
        text = " ".join(self.pending_items)
        if not text.strip():
            raise errors.invalid("no input: send conversation.item.create with input_text first", code="no_input")
        await self.respond(text, event.response)
        self.pending_items.clear()
        await self._report_unsupported(event.response, "response", event.event_id)

    async def _report_unsupported(self, options: OutputOptions, where: str, event_id: str | None) -> None:
        if fields := options.unsupported():
            names = ", ".join(f"{where}.{f}" for f in fields)
            await self.error(errors.invalid(f"{names}: not supported by this text-to-speech server; "
                                            "ignored (everything else was applied)", f"{where}.{fields[0]}",
                                            "unsupported_field"), event_id)

    async def _voice(self, voice: str | None, param: str, engine: Engine | None = None) -> VoiceChoice:
        """A built-in voice, or a created one (by id or name) of the session's model."""
        return await voice_library.resolve(self.state, engine or self.engine, voice, param)

    def require_idle(self) -> None:
        if self.active is not None:
            raise errors.invalid(f"response {self.active.id} is still in progress",
                                 code="conversation_already_has_active_response")

    def cancel(self, response_id: str | None) -> None:
        active = self.active
        if active is None or (response_id is not None and response_id != active.id):
            raise errors.invalid("there is no active response to cancel", "response_id", "response_cancel_not_active")
        active.stream.cancel()

    # Responses ----------------------------------------------------------------------------------------------
    async def respond(self, text: str, options: OutputOptions, streaming: bool = False) -> None:
        """A response to `text`; `streaming`: text that is only its beginning (the rest is appended)."""
        s = {**self.settings, **options.settings()}
        voice = await self._voice(s.get("voice"), "response.voice")  # again: it may have been deleted since
        if self.responses >= MAX_RESPONSES_PER_SESSION:
            raise errors.invalid(f"a session may create at most {MAX_RESPONSES_PER_SESSION} responses; open a new one",
                                 code="session_response_limit")
        limit = s.get("max_output_tokens", "inf")
        names = ("language", "seed", "temperature", "top_k", "top_p", "repetition_penalty", "text_layout")
        fields: dict[str, Any] = {k: s.get(k) for k in names} | voice.fields(s.get("instructions"))
        if not streaming:  # a streamed text is spoken as it comes
            fields["normalize"] = s.get("normalize", True)
        fields["max_frames"] = None if limit == "inf" else limit
        fields["timestamps"] = s.get("timestamps") == "word"
        engine, speed = self.engine, s.get("speed", 1.0)
        request = None
        if not streaming:
            request = SpeechRequest(text=text, **fields)
            try:
                await engine.prepare(request)  # off the event loop where it takes milliseconds; `submit` takes it
            except Exception as exc:
                raise errors.from_exception(exc) from exc
        transcoder = Transcoder(AudioFormat.PCM, engine.sample_rate, None, speed)
        feed: SpeechInput | None = None
        try:
            if request is None:
                feed = engine.submit(StreamingSpeechRequest(text=text, **fields))
                stream = feed.stream
            else:
                stream = engine.submit(request)
        except Exception as exc:
            transcoder.close()
            raise errors.from_exception(exc) from exc
        self.responses += 1
        self.active = active = ActiveResponse(stream, AsyncTranscoder(transcoder, self.state.executor), text,
                                              s.get("voice"), speed, limit, self.conversation_id, self.last_item_id,
                                              feed)
        if feed is not None:
            feed.on_timeout = self._text_ended
        self.last_item_id = active.item_id
        await self.send_all(active.opening(self._eid))
        active.task = asyncio.create_task(self._stream(active), name=f"realtime-{active.id}")
        open_responses = self.state.metrics.open_responses.labels(PROTOCOL)
        open_responses.inc()
        active.task.add_done_callback(lambda _: open_responses.dec())  # also when cancelled before it ran

    async def _stream(self, active: ActiveResponse) -> None:
        stream = active.stream
        first = True
        try:
            async for pcm in stream.events():
                if isinstance(pcm, Timestamps):
                    await self.send(active.timestamps(self._eid, pcm))
                    continue
                if first:
                    self.state.metrics.first_audio(PROTOCOL, stream.time_to_first_audio)
                    first = False
                if data := await active.out.encode(pcm):
                    await self.send(active.delta(self._eid, data))
            if stream.finish_reason is not FinishReason.CANCELLED and (tail := await active.out.flush()):
                await self.send(active.delta(self._eid, tail))
            await self._done(active, *outcome(stream.finish_reason))
        except asyncio.CancelledError:
            stream.cancel()
            raise
        except Exception as exc:
            err = errors.from_exception(exc)
            log.warning("realtime response %s failed: %s", active.id, exc)
            self.state.metrics.error(err.detail.type, err.detail.code)
            stream.cancel()
            await self._done(active, ResponseStatus.FAILED, failed(err.detail.model_dump()))
        finally:
            active.out.close()
            if self.active is active:
                self.active = None
            reason = stream.finish_reason.value if stream.finish_reason else "cancelled"
            self.state.metrics.finished(PROTOCOL, reason, stream.usage.audio_seconds)

    async def _done(self, active: ActiveResponse, status: ResponseStatus, details: dict[str, Any] | None) -> None:
        """The closing events. The response stays the active one until `response.done` is about to leave: a next
        response's events cannot come between its closing events, and a client that answers `response.done` at once
        finds the session idle (no await lies between the release and that send taking the send lock)."""
        *closing, done = active.closing(self._eid, status, details)
        await self.send_all(closing)
        if self.active is active:
            self.active = None
        await self.send(done)
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


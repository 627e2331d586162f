"""`POST /v1/audio/speech`: OpenAI's speech API, streamed as chunked audio or as server-sent events."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine import AudioStream, Engine, FinishReason, SpeechRequest, TextLayout, Timestamps
from server import errors
from server.audio.encoders import CONTENT_TYPES, AudioFormat, resolve_output_rate
from server.audio.transcode import AsyncTranscoder, Transcoder
from server.http_protocol import abort_of
from server.protocol import (
    ErrorEnvelope,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechAudioTimestamps,
    SpeechBody,
    SpeechError,
    SpeechUsage,
    StreamFormat,
    incomplete,
    timed,
)
from server.state import ServerState, server_state
from server.voices import library as voice_library
from server.voices.library import VoiceChoice

log = logging.getLogger("talkstream.speech")
router = APIRouter()

DISCONNECT_POLL_S = 0.25
STALL_GRACE_S = 1.0  # a failed stream whose body has not ended this long after is stuck in a send
PROTOCOL = "http"

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorEnvelope} for code in (400, 401, 429, 503)
}
_AUDIO: dict[int | str, dict[str, Any]] = {200: {
    "content": {ct: {} for ct in [*CONTENT_TYPES.values(), "text/event-stream"]},
    "description": "Audio bytes (chunked), or server-sent events with stream_format=sse",
}}


class AudioResponse(StreamingResponse):
    """A streaming response that always closes its body generator and releases its request, whatever ends the
    response (a disconnect seen by `send` instead of a cancellation included). If the engine fails the request
    while a send is blocked (a reader that stopped reading was dropped), the send is abandoned and the
    connection aborted."""

    def __init__(self, body: AsyncGenerator[bytes | str, None], speech: Speech, **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self._body, self._speech = body, speech
        self._abort: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._abort = abort_of(scope)
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        try:
            async with aclosing(self._body):
                await self._unless_stalled(super().stream_response(send))
        finally:
            self._speech.close()

    async def _unless_stalled(self, sending: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(sending)
        failed_at: float | None = None
        try:
            while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_S))[0]:
                if self._speech.failure is None:
                    continue
                now = asyncio.get_running_loop().time()
                failed_at = failed_at or now
                if now - failed_at >= STALL_GRACE_S:
                    break
            else:
                return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        log.warning("aborting the connection of %s: its stream failed while a send was blocked",
                    self._speech.stream.request_id)
        if self._abort is not None:
            self._abort()
        raise StreamAbortedError("the stream failed while its reader was not reading")


@dataclass(eq=False)  # hashed by identity: the server state keeps a set of them
class Speech:
    """One request in flight: its engine stream, its transcoder and what it reports when it ends."""

    state: ServerState
    stream: AudioStream
    out: AsyncTranscoder
    rate: int  # the output sample rate
    speed: float = 1.0  # the audio's, after the engine: times are divided by it
    words: bool = False  # timestamps were asked for: they come between the audio's chunks
    closed: bool = field(default=False, init=False)
    cut_error: errors.ApiError | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.state.metrics.open_responses.labels(PROTOCOL).inc()
        self.state.speeches.add(self)
        self._items = self.stream.events() if self.words else aiter(self.stream)

    async def next_pcm(self) -> np.ndarray | Timestamps | None:
        try:
            item: np.ndarray | Timestamps | None = await anext(self._items)
        except StopAsyncIteration:
            item = None
        if self.cut_error is not None:
            raise self.cut_error
        return item

    @property
    def failure(self) -> BaseException | None:
        return self.cut_error or self.stream.error

    def cut(self, err: errors.ApiError) -> None:
        """The server's shutdown timeout passed: end the response now, without the audio still buffered."""
        self.cut_error = err
        self.stream.cancel()

    async def encoded(self, first: np.ndarray | None) -> AsyncIterator[bytes | SpeechAudioTimestamps]:
        """Encoded bytes of every chunk, then the encoder's tail; empty pieces are skipped. With `words`, each
        segment's timestamps in their place."""
        pcm: np.ndarray | Timestamps | None = first
        while pcm is not None:
            if isinstance(pcm, Timestamps):
                yield self.timestamps(pcm)
            elif data := await self.out.encode(pcm):
                yield data
            pcm = await self.next_pcm()
        tail = await self.out.flush()
        if tail:
            yield tail

    def timestamps(self, ts: Timestamps) -> SpeechAudioTimestamps:
        return SpeechAudioTimestamps(**timed(ts, self.speed))

    def usage(self) -> SpeechUsage:
        u, samples = self.stream.usage, self.out.samples
        return SpeechUsage(input_tokens=u.input_tokens, output_tokens=u.frames, total_tokens=u.input_tokens + u.frames,
                           audio_seconds=round(samples / self.rate, 4), samples=samples)

    def done(self) -> SpeechAudioDone:
        """The SSE stream's last event. A response cut by a limit is `incomplete` (as Realtime says it)."""
        details = incomplete(self.stream.finish_reason)
        return SpeechAudioDone(status="incomplete" if details else "completed", status_details=details,
                               transcript=self.stream.transcript, language=self.stream.language, usage=self.usage())

    def cancel(self) -> None:
        self.stream.cancel()

    def fail(self, exc: Exception) -> errors.ApiError:
        err = errors.from_exception(exc)
        log.warning("speech %s ended early after %.2f s of audio: %s", self.stream.request_id,
                    self.stream.usage.audio_seconds, exc)
        self.state.metrics.error(err.detail.type, err.detail.code)
        self.stream.cancel()
        return err

    def close(self) -> None:
        """Idempotent: cancels the request if it is still running, closes the encoder, counts the outcome."""
        if self.closed:
            return
        self.closed = True
        self.state.speeches.discard(self)
        self.stream.cancel()
        self.out.close()
        self.state.metrics.open_responses.labels(PROTOCOL).dec()
        reason = self.stream.finish_reason or FinishReason.CANCELLED
        self.state.metrics.finished(PROTOCOL, reason.value, self.stream.usage.audio_seconds)


@router.post("/audio/speech", response_class=Response, responses={**_AUDIO, **_ERRORS})
async def create_speech(body: SpeechBody, request: Request) -> Response:
    state = server_state(request)
    fmt = AudioFormat(body.response_format)
    engine = state.engine_for(body.model)
    engine.check_admission()  # a 503 or 429 first: not after decoding or cloning a voice
    req, rate = speech_request(engine.sample_rate, body, fmt, await speech_voice(state, engine, body))
    await engine.prepare(req)  # off the event loop where it takes milliseconds; `submit` takes what it made
    transcoder = Transcoder(fmt, engine.sample_rate, body.sample_rate, body.speed)
    try:
        stream = engine.submit(req)
    except BaseException:
        transcoder.close()
        raise
    if state.log_input:
        log.info("speech %s input: %r", req.request_id, body.input)
    speech = Speech(state, stream, AsyncTranscoder(transcoder, state.executor), rate, body.speed, req.timestamps)
    try:
        first = await first_chunk(stream, request)
        if speech.cut_error is not None:  # cut by the shutdown before any audio: a plain 503
            raise speech.cut_error
    except ClientGoneError:
        speech.close()
        return Response(status_code=errors.CLIENT_CLOSED)
    except BaseException:
        speech.close()
        raise
    state.metrics.first_audio(PROTOCOL, stream.time_to_first_audio)
    headers = {"X-Request-Id": req.request_id, "Cache-Control": "no-cache"}
    if body.stream_format == StreamFormat.SSE:
        return AudioResponse(sse_body(speech, first), speech, media_type="text/event-stream",
                             headers={**headers, "X-Accel-Buffering": "no"})
    return AudioResponse(audio_body(speech, first), speech, media_type=CONTENT_TYPES[fmt], headers=headers)


async def speech_voice(state: ServerState, engine: Engine, body: SpeechBody) -> VoiceChoice:
    """The voice a request names, or the one its `ref_audio` clones for it alone."""
    if body.ref_audio is not None:
        return await voice_library.one_off(engine, body.ref_audio, body.ref_text)
    if body.ref_text is not None:
        raise errors.invalid("ref_text: the words of ref_audio; send ref_audio with it", "ref_text", "invalid_value")
    if body.voice is None:
        raise errors.invalid("voice: Field required (or ref_audio, to clone a voice for this request)", "voice",
                             "missing_field")
    return await voice_library.resolve(state, engine, body.voice_name)


def speech_request(model_rate: int, body: SpeechBody, fmt: AudioFormat,
                   voice: VoiceChoice) -> tuple[SpeechRequest, int]:
    """Checks what the engine does not know about (the output rate) and builds its request; and the output rate."""
    try:
        rate = resolve_output_rate(fmt, model_rate, body.sample_rate)
    except ValueError as exc:
        raise errors.invalid(str(exc), "sample_rate", "invalid_value") from None
    if body.timestamps is not None and body.stream_format != StreamFormat.SSE:
        raise errors.invalid("timestamps come as server-sent events: send stream_format 'sse' with them (a plain "
                             "audio stream has no place for them)", "timestamps", "invalid_value")
    return SpeechRequest(text=body.input, language=body.language, normalize=body.normalize,
                         timestamps=body.timestamps is not None,
                         **voice.fields(body.instructions),
                         seed=body.seed, temperature=body.temperature,
                         top_k=body.top_k, top_p=body.top_p, repetition_penalty=body.repetition_penalty,
                         text_layout=None if body.text_layout is None else TextLayout(body.text_layout)), rate


async def first_chunk(stream: AudioStream, request: Request) -> np.ndarray | None:
    """The first PCM chunk (None if the stream ended without audio); raises ClientGoneError if the client left.

    Waiting here lets a failure before any audio still answer with a proper status.
    """

    async def pull() -> np.ndarray | None:
        try:
            return await anext(stream)
        except StopAsyncIteration:
            return None

    task = asyncio.ensure_future(pull())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                log.info("client left before the first audio of %s", stream.request_id)
                raise ClientGoneError
    except BaseException:
        task.cancel()
        stream.cancel()
        raise


async def audio_body(speech: Speech, first: np.ndarray | None) -> AsyncGenerator[bytes | str, None]:
    """Chunked audio. A failure mid-stream aborts the connection (no final chunk), so clients see a truncated
    transfer rather than a short file that looks complete. A plain audio stream has no place for a status: one
    that a limit cut short (see `Speech.done`) ends normally; the SSE and Realtime protocols say it."""
    try:
        async for data in speech.encoded(first):
            if isinstance(data, bytes):
                yield data
    except (asyncio.CancelledError, GeneratorExit):
        speech.cancel()
        raise
    except Exception as exc:
        raise StreamAbortedError(speech.fail(exc).detail.message) from exc
    finally:
        speech.close()


async def sse_body(speech: Speech, first: np.ndarray | None) -> AsyncGenerator[bytes | str, None]:
    """`speech.audio.delta` events, then `speech.audio.done` with usage; a failure ends with an `error` event."""
    try:
        async for data in speech.encoded(first):
            if isinstance(data, SpeechAudioTimestamps):
                yield sse(data.model_dump_json(exclude_none=True))
            else:
                yield sse(SpeechAudioDelta(audio=base64.b64encode(data).decode()).model_dump_json())
        yield sse(speech.done().model_dump_json(exclude_none=True))
    except (asyncio.CancelledError, GeneratorExit):
        speech.cancel()
        raise
    except Exception as exc:
        yield sse(SpeechError(error=speech.fail(exc).detail).model_dump_json())
    finally:
        speech.close()


def sse(data: str) -> str:
    return f"data: {data}\n\n"


class ClientGoneError(Exception):
    """The client disconnected while its request waited for the first audio."""


class StreamAbortedError(RuntimeError):
    """Raised out of a response body to drop the connection after a mid-stream failure."""

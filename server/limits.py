"""Request body size limit: a body past `max_bytes` is refused with 413 in the OpenAI error envelope.

Bodies of POST requests are read here (small JSON documents, or an audio upload of at most 10 MiB) and replayed to
the app, so a chunked body without Content-Length is bounded too.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server import errors
from server.audio.input import MAX_BYTES as MAX_AUDIO_BYTES

MAX_BODY_BYTES = 1 << 20
# Routes that take audio: an upload's file plus its form fields; a speech request's `ref_audio` as base64 (4/3 of
# the file). A file a little past its limit gets the route's own 400, which names the field.
UPLOAD_BODY_BYTES = MAX_AUDIO_BYTES + MAX_BODY_BYTES
SPEECH_BODY_BYTES = MAX_AUDIO_BYTES * 4 // 3 + MAX_BODY_BYTES
LARGER = {"/v1/audio/voices": UPLOAD_BODY_BYTES, "/v1/audio/voice_consents": UPLOAD_BODY_BYTES,
          "/v1/audio/speech": SPEECH_BODY_BYTES}


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, larger: dict[str, int] | None = None) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.larger = LARGER if larger is None else larger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        limit = self.larger.get(scope["path"], self.max_bytes)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await self._refuse(limit, scope, receive, send)
            return
        messages: list[Message] = []
        size, more = 0, True
        while more:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > limit:
                await self._refuse(limit, scope, receive, send)
                return
            more = message.get("more_body", False)

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        err = errors.too_large(f"the request body is larger than {limit} bytes")
        await err.response()(scope, receive, send)

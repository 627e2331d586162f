"""A Realtime session's input text buffer (`input_text_buffer.append` / `commit` / `clear`).

Text is buffered until committed, then spoken as one response. With the session's `text_streaming`, it is spoken
while it is still being written: the first append starts a response at once, later appends feed it, and the commit
ends its text (engine/text_input.py). The text stream lives as long as its response: once the response has
ended (its text done and spoken, cancelled, cut by a limit), the next append starts another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine import RequestError, SpeechInput
from server import errors
from server.realtime.protocol import OutputOptions
from server.realtime.response import ActiveResponse

MAX_BUFFER_CHARS = 4096  # the input text buffer and pending items, as for `input` over HTTP


class Responder(Protocol):
    active: ActiveResponse | None
    settings: dict[str, Any]

    async def respond(self, text: str, options: OutputOptions, streaming: bool = False) -> None: ...

    def require_idle(self) -> None: ...


class InputText:
    def __init__(self, session: Responder) -> None:
        self.session = session
        self.buffer: list[str] = []

    def streaming_into(self) -> SpeechInput | None:
        """The text handle of the active response while its text is still open."""
        active = self.session.active
        feed = active.feed if active is not None else None
        return feed if feed is not None and not feed.finished and not feed.stream.done else None

    async def append(self, text: str) -> None:
        if (feed := self.streaming_into()) is not None:
            engine_call(feed.append, text)
        elif self.session.settings.get("text_streaming"):
            self.session.require_idle()  # text appended before streaming was turned on goes first
            await self.session.respond("".join(self.buffer) + text, OutputOptions(), streaming=True)
            self.buffer.clear()
        else:
            check_room(self.buffer, text)
            self.buffer.append(text)

    async def commit(self) -> None:
        if (feed := self.streaming_into()) is not None:
            engine_call(feed.finish)
            return
        active = self.session.active
        if active is not None and active.feed is not None and active.feed.timed_out and not self.buffer:
            return  # its text was already ended for being quiet (the client was told): this commit is that end
        self.session.require_idle()
        text = "".join(self.buffer)
        if not text.strip():
            raise errors.invalid("the input text buffer is empty", code="input_text_buffer_empty")
        await self.session.respond(text, OutputOptions())
        self.buffer.clear()

    def clear(self) -> None:
        if self.streaming_into() is not None:
            raise errors.invalid("text already streamed into the response cannot be taken back; cancel the "
                                 "response with response.cancel", code="input_text_buffer_streaming")
        self.buffer.clear()


def check_room(buffer: list[str], text: str) -> None:
    if sum(map(len, buffer)) + len(buffer) + len(text) > MAX_BUFFER_CHARS:
        raise errors.invalid(f"the input text would exceed {MAX_BUFFER_CHARS} characters; commit or clear it",
                             "text", "input_text_buffer_full")


def engine_call(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except RequestError as exc:
        raise errors.from_exception(exc) from exc


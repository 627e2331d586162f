"""The text side of a request whose text arrives while it is spoken: what `Engine.submit(StreamingSpeechRequest)`
returns, its audio `stream` beside `append` and `finish`. Event loop only.

Tokens leave as they settle (frontend/text_stream.py): the request goes to the Talker with its text's first
token (the streaming layout's prompt holds it), each later token in a `Feed` that the worker writes into the slot's
text row; the Talker waits, stepping nothing, whenever it has spoken every token it has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from common.request import MAX_INPUT_CHARS, MAX_TEXT_S, MIN_TEXT_RATE, RequestError, TextEnd
from frontend.text_stream import TextStream, visible_chars
from output_builder.streams import AudioStream
from talker.models.qwen3_tts.prompt import ROLE_TOKENS
from talker.worker import Feed

log = logging.getLogger("talkstream.engine")
ROLE = ROLE_TOKENS - 1  # the stream's first tokens are the role's ("assistant", "\n"), then the text's
HEAD = ROLE + 1  # the prompt holds the role's tokens and the text's first
Start = Callable[[list[int], bool], None]  # (the head and every token after it so far, whether the text has ended)


class SpeechInput:
    """`append` text as it comes (str, or UTF-8 bytes cut anywhere), then `finish` it; read the audio from
    `stream`. A text with no visible character appended for longer than the engine's `text_timeout_s`, or slower
    than `MIN_TEXT_RATE` after that long, or open for `MAX_TEXT_S`, is finished for its writer (`timed_out` says why,
    and `on_timeout` is called with it). Appending to a request that has ended (cancelled, failed) does nothing."""

    def __init__(self, request_id: str, stream: AudioStream, text: TextStream, start: Start,
                 send: Callable[[Feed], None], max_tokens: int, base_tokens: int = 0,
                 admit: Callable[[], bool] | None = None, ended: Callable[[int], None] | None = None) -> None:
        self.request_id, self.stream = request_id, stream
        self.finished = False  # no more text
        self.timed_out: TextEnd | None = None  # why the engine ended its text, if it did
        self.on_timeout: Callable[[TextEnd], None] | None = None
        self.opened = self.last_append = time.monotonic()
        self.visible = 0  # visible characters received
        self._text, self._start, self._send = text, start, send
        self._head: list[int] | None = []  # tokens released before it started; None once started
        self._released = 0  # tokens released, the role's included
        self._max_tokens, self._base_tokens = max_tokens, base_tokens
        self._admit = admit  # a blank text's admission, asked at its first visible character (None: admitted)
        self._ended = ended  # told the text's tokens (the role's included) when it ends: its speech's cap follows

    @property
    def text(self) -> str:
        """The text received so far."""
        return self._text.text

    def append(self, text: str | bytes) -> None:
        if self.finished:
            raise RequestError("the text has already been finished", param="text")
        if self._text.chars + len(text) > MAX_INPUT_CHARS:
            raise RequestError(f"the text would exceed {MAX_INPUT_CHARS} characters; finish it and start another",
                               param="text")
        before = self._text.chars
        tokens = self._text.append(text)
        if self._text.chars > before and (seen := visible_chars(self._text.text[before:])):
            # only visible text is activity: empty, blank or invisible pieces (or bytes that complete no character)
            # cost nothing against the budget, or little, and would otherwise keep a text open forever
            self.visible += seen
            self.last_append = time.monotonic()
            if self._admit is not None:
                admit, self._admit = self._admit, None
                if not admit():
                    return  # refused: its stream has ended with the reason
        self._take(tokens, done=False)

    def finish(self) -> None:
        """Idempotent. The end of the text: the Talker speaks the rest, then its end of text."""
        if not self.finished:
            self.finished = True
            self._take(self._text.finish(), done=True)

    def time_out(self, why: TextEnd = TextEnd.QUIET) -> None:
        if self.finished:
            return
        self.timed_out = why
        self.finish()
        if self.on_timeout is not None:
            self.on_timeout(why)

    def overdue(self, now: float, timeout: float) -> TextEnd | None:
        """Why its text should end now (None: it may stay open); `timeout` is the engine's `text_timeout_s`."""
        if self.finished or self.stream.done:
            return None
        if now - self.last_append > timeout:
            return TextEnd.QUIET
        age = now - self.opened
        if age > MAX_TEXT_S:
            return TextEnd.EXPIRED
        if age > timeout and self.visible < MIN_TEXT_RATE * age:
            return TextEnd.SLOW
        return None

    def _take(self, tokens: list[int], done: bool) -> None:
        if self.stream.done:
            return
        room = self._max_tokens + ROLE - self._released
        over = len(tokens) > room
        if over:  # what fits is spoken, and the text ends there
            tokens, done, self.finished = tokens[: max(room, 0)], True, True
        self._released += len(tokens)
        self.stream.usage.input_tokens = self._base_tokens + max(0, self._released - ROLE)
        if done and self._ended is not None:
            self._ended(self._released)
        if self._head is None:
            if tokens or done:
                self._send(Feed(self.request_id, tuple(tokens), done))
        else:
            self._head += tokens
            # a blank start waits: tokens of spaces alone would be spoken, yet a blank text is no text
            blank = not self.visible
            if (len(self._head) >= HEAD and not blank) or done:
                head, self._head = self._head, None
                self._start([] if blank else head, done)
        if over:
            log.warning("request %s: its text is longer than one response can take", self.request_id)
            raise RequestError(f"the text is longer than one response can take ({self._max_tokens} tokens); "
                               "it ends where that was reached", param="text")

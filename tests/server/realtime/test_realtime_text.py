"""Text streamed into a Realtime response while it is spoken (`session.update` `text_streaming`), and the
`text_layout` field of an ordinary request, over real sockets. Every server event parses as the official `openai`
SDK's model of it (`recv`). Order is shown by events: a piece is sent after audio of the earlier ones has come."""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from engine import MAX_TEXT_S
from server.realtime.input import InputText
from tests.server.conftest import LiveServer
from tests.server.leaks import wait_no_leaks
from tests.server.realtime_client import OPENING, assert_completed, assert_sequence, recv, send, until_done

TEXT = "Hello there, my friend. It's 3 o'clock, and the café is open!"


@pytest.fixture
def ws(live: LiveServer) -> Iterator[ClientConnection]:
    with connect(live.ws_url, max_size=None, open_timeout=30) as conn:
        yield session(conn, seed=7)


def session(conn: ClientConnection, **settings: Any) -> ClientConnection:
    """A streaming-text session in a named language, its whole texts not normalised: a whole text left to detection
    may be spoken in another prompt than a streamed one (which has no text to detect from when it starts), and a
    streamed text is spoken as it comes (its "3" is not read out as "three")."""
    assert recv(conn)["type"] == "session.created"
    send(conn, "session.update", session={"text_streaming": True, "language": "english", "normalize": False,
                                          **settings})
    updated = recv(conn)
    assert updated["type"] == "session.updated" and updated["session"]["text_streaming"] is True
    return conn


def ordinary(conn: ClientConnection, text: str, layout: str = "streaming") -> bytes:
    """The whole text at once, as an ordinary response in the given layout."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    send(conn, "conversation.item.create", item=item)
    assert [recv(conn)["type"] for _ in range(2)] == ["conversation.item.added", "conversation.item.done"]
    send(conn, "response.create", response={"text_layout": layout})
    events, audio = until_done(conn)
    assert_completed(events, audio)
    return audio


def streamed(conn: ClientConnection, pieces: list[str]) -> tuple[list[dict[str, Any]], bytes]:
    """The first piece starts the response at once; the others follow back to back, racing the Talker; the commit
    ends its text."""
    send(conn, "input_text_buffer.append", text=pieces[0])
    events = [recv(conn) for _ in OPENING]
    assert [e["type"] for e in events] == OPENING  # at once, before the text is complete
    for piece in pieces[1:]:
        send(conn, "input_text_buffer.append", text=piece)
    send(conn, "input_text_buffer.commit")
    more, _ = until_done(conn)
    events += more
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    return events, audio


def wait_starved(live: LiveServer) -> None:
    """Until a request holds its slot waiting for text (it has spoken all it has; read off the worker's state)."""
    worker = live.engine.worker
    assert worker is not None
    deadline = time.monotonic() + 30
    while not any(seq.starved for seq in list(worker.scheduler.running)):
        assert time.monotonic() < deadline, "no request waits for text"
        time.sleep(0.005)


def test_a_streamed_text_sounds_as_the_whole_text_in_the_streaming_layout(ws: ClientConnection) -> None:
    want = ordinary(ws, TEXT)
    rng = random.Random(3)
    for _ in range(3):
        points = sorted(rng.sample(range(1, len(TEXT)), 6))
        pieces = [TEXT[a:b] for a, b in zip([0, *points], [*points, len(TEXT)], strict=True)]
        events, audio = streamed(ws, pieces)
        done = assert_sequence(events, "completed")
        assert audio == want and done["output"][0]["content"][0]["transcript"] == TEXT
        assert done["usage"]["input_tokens"] > 0 and len(audio) == 2 * done["usage"]["samples"]
    assert ordinary(ws, TEXT, "full") != want  # the layout field reaches the model


def test_pieces_sent_while_it_waits_resume_where_it_stopped(live: LiveServer, ws: ClientConnection) -> None:
    """The Talker speaks what it has, waits for more, and goes on: the audio is that of the whole text."""
    want = ordinary(ws, TEXT)
    words = TEXT.split(" ")
    send(ws, "input_text_buffer.append", text=" ".join(words[:4]))
    events = [recv(ws) for _ in OPENING]
    for word in words[4:]:
        wait_starved(live)
        send(ws, "input_text_buffer.append", text=" " + word)
    send(ws, "input_text_buffer.commit")
    more, _ = until_done(ws)
    events += more
    assert_sequence(events, "completed")
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert audio == want


def test_cancel_while_it_waits_for_text(live: LiveServer, ws: ClientConnection) -> None:
    send(ws, "input_text_buffer.append", text="These words come, and then no more")
    events = [recv(ws) for _ in OPENING]
    wait_starved(live)
    send(ws, "response.cancel")
    more, _ = until_done(ws)
    assert_sequence(events + more, "cancelled")
    assert not wait_no_leaks(live.url)
    events, audio = streamed(ws, ["The text stream ended with its response: ", "this is a new one."])
    assert_completed(events, audio)


def test_a_quiet_text_is_ended_and_the_client_told(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(text_timeout_s=0.3)
    with connect(server.ws_url, max_size=None, open_timeout=30) as conn:
        session(conn, seed=1)
        send(conn, "input_text_buffer.append", text="A writer who stops mid sentence and")
        events: list[dict[str, Any]] = []
        told: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "response.done":
            event = recv(conn)
            (told if event["type"] == "error" else events).append(event)
        [error] = told
        assert error["error"]["code"] == "input_text_timeout" and error["error"]["param"] == "text"
        done = assert_sequence(events, "completed")
        assert done["output"][0]["content"][0]["transcript"] == "A writer who stops mid sentence and"
        send(conn, "input_text_buffer.append", text="A new text, a new response.")
        send(conn, "input_text_buffer.commit")
        assert_completed(*until_done(conn))
    assert not wait_no_leaks(server.url)


@pytest.mark.parametrize(("age", "text", "code"), [
    (60.0, "Slow words", "input_text_too_slow"),  # 9 visible characters in a minute
    (MAX_TEXT_S + 1, "Many words. " * 60, "input_text_expired"),  # 660: fast enough, but open too long
], ids=["too-slow", "expired"])
def test_a_trickling_text_is_ended_and_the_client_told(live: LiveServer, age: float, text: str, code: str) -> None:
    """A text never quiet long enough to time out still ends: below the rate floor or at its lifetime, as if
    committed, the client told why. No time passes: the text is made to have opened `age` seconds ago (its
    `opened` moved back) and the engine's own watchdog finds it."""
    with connect(live.ws_url, max_size=None, open_timeout=30) as conn:
        session(conn, seed=1)
        send(conn, "input_text_buffer.append", text=text)
        events = [recv(conn) for _ in OPENING]
        [feed] = live.engine.live.texts()
        feed.opened = feed.last_append - age
        told: list[dict[str, Any]] = []
        while events[-1]["type"] != "response.done":
            event = recv(conn)
            (told if event["type"] == "error" else events).append(event)
        [error] = told
        assert error["error"]["code"] == code and error["error"]["param"] == "text"
        done = assert_sequence(events, "completed")
        assert done["output"][0]["content"][0]["transcript"] == text
    assert not wait_no_leaks(live.url)


def test_disconnect_while_it_waits_for_text(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None, open_timeout=30) as conn:
        session(conn)
        send(conn, "input_text_buffer.append", text="A client that leaves while it writes")
        assert [recv(conn)["type"] for _ in OPENING] == OPENING
        wait_starved(live)
    assert not wait_no_leaks(live.url)


def test_bad_events_while_streaming_are_errors_and_the_session_goes_on(ws: ClientConnection) -> None:
    send(ws, "input_text_buffer.append", text="Some text that is still arriving")
    events = [recv(ws) for _ in OPENING]
    send(ws, "input_text_buffer.clear")
    send(ws, "input_text_buffer.append", text="\ud800x")  # json.dumps escapes it: a lone surrogate inside
    send(ws, "response.create")
    send(ws, "input_text_buffer.append", text=" and ends here.")
    send(ws, "input_text_buffer.commit")
    send(ws, "input_text_buffer.append", text="Too soon: the response is still speaking.")
    errors: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    while not rest or rest[-1]["type"] != "response.done":
        event = recv(ws)
        (errors if event["type"] == "error" else rest).append(event)
    codes = [e["error"]["code"] for e in errors]
    assert codes == ["input_text_buffer_streaming", "invalid_event", "conversation_already_has_active_response",
                     "conversation_already_has_active_response"]
    done = assert_sequence(events + rest, "completed")
    assert done["output"][0]["content"][0]["transcript"] == "Some text that is still arriving and ends here."


def test_the_http_text_layout_field(client: httpx.Client) -> None:
    def speech(**fields: Any) -> httpx.Response:
        body = {"model": "tiny", "input": TEXT, "voice": "alloy", "response_format": "pcm", "seed": 4, **fields}
        return client.post("/v1/audio/speech", json=body)

    full, streaming, default = (speech(text_layout="full"), speech(text_layout="streaming"), speech())
    assert full.status_code == streaming.status_code == default.status_code == 200
    assert default.content == streaming.content != full.content  # tiny's own layout is the streaming one
    bad = speech(text_layout="sideways")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text_layout"


def test_text_buffered_before_streaming_was_turned_on_goes_first(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None, open_timeout=30) as conn:
        assert recv(conn)["type"] == "session.created"
        send(conn, "input_text_buffer.append", text="Buffered first, ")
        send(conn, "session.update", session={"text_streaming": True})
        assert recv(conn)["type"] == "session.updated"
        send(conn, "input_text_buffer.append", text="then streamed.")
        send(conn, "input_text_buffer.commit")
        events, audio = until_done(conn)
        done = assert_sequence(events, "completed")
        assert done["output"][0]["content"][0]["transcript"] == "Buffered first, then streamed." and audio


async def test_a_commit_after_a_quiet_timeout_is_that_end_not_an_error() -> None:
    """The client's commit may cross the `input_text_timeout` event: while the response speaks on, it is a no-op."""

    class Feed:
        finished, timed_out, stream = True, True, None

    class Session:
        def __init__(self) -> None:
            self.settings = {"text_streaming": True}
            self.active = SimpleNamespace(feed=Feed())

        async def respond(self, text: str, options: Any, streaming: bool = False) -> None:
            raise AssertionError("no new response")

        def require_idle(self) -> None:
            raise AssertionError("not asked")

    text = InputText(Session())  # type: ignore[arg-type]
    await text.commit()
    text.buffer.append("more")  # but text after it is not that end
    with pytest.raises(AssertionError, match="not asked"):
        await text.commit()


def test_blank_texts_take_no_place_and_a_refused_first_word_fails_its_response(
        make_server: Callable[..., LiveServer]) -> None:
    """Idle sessions streaming blanks (or characters that draw nothing) do not lock others out; the first word of
    one asks for a place, and when the server is full its response ends `failed` (server_busy), not hanging."""
    server = make_server(max_batch=1, max_queue=0)
    with connect(server.ws_url, max_size=None, open_timeout=30) as idle, \
            connect(server.ws_url, max_size=None, open_timeout=30) as busy, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        session(idle, seed=1)
        session(busy, seed=2)
        invisible = " \u200b\u2060\ufeff\U000e0041\u3164\u2800\u0301\ufe0f\u200e\x00\x07"
        send(idle, "input_text_buffer.append", text=invisible)
        assert [recv(idle)["type"] for _ in OPENING] == OPENING
        body = {"model": "tiny", "input": "Served beside a blank text.", "voice": "alloy", "response_format": "pcm"}
        assert http.post("/v1/audio/speech", json=body).status_code == 200
        send(busy, "input_text_buffer.append", text="These words take the only place")
        opening = [recv(busy) for _ in OPENING]
        send(idle, "input_text_buffer.append", text="Hello")
        events, _ = until_done(idle)
        done = events[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "server_busy"
        send(busy, "input_text_buffer.commit")
        events, audio = until_done(busy)
        assert_completed(opening + events, audio)
        send(idle, "input_text_buffer.append", text="Now there is room.")
        send(idle, "input_text_buffer.commit")
        assert_completed(*until_done(idle))
    assert not wait_no_leaks(server.url)


def speak(http: httpx.Client, text: str) -> bytes:
    body = {"model": "tiny", "input": text, "voice": "alloy", "response_format": "pcm", "seed": 1}
    response = http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200 and response.content
    return response.content


def test_a_waiting_response_gives_its_slot_to_an_http_request_and_sounds_the_same(
        make_server: Callable[..., LiveServer]) -> None:
    """One Talker slot: whenever the streamed text runs out, an HTTP request is served in its slot (the waiting
    response parked meanwhile); the response's audio is still that of the whole text."""
    server = make_server(max_batch=1)
    with connect(server.ws_url, max_size=None, open_timeout=30) as conn, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        session(conn, seed=7)
        want = ordinary(conn, TEXT)
        words = TEXT.split(" ")
        send(conn, "input_text_buffer.append", text=" ".join(words[:3]))
        events = [recv(conn) for _ in OPENING]
        for word in words[3:]:
            wait_starved(server)
            speak(http, "Served meanwhile.")
            send(conn, "input_text_buffer.append", text=" " + word)
        send(conn, "input_text_buffer.commit")
        more, _ = until_done(conn)
        events += more
        assert_sequence(events, "completed")
        assert not [e for e in events if e["type"] == "error"]  # its text never timed out while others were served
        audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
        assert audio == want
    assert not wait_no_leaks(server.url)


def test_as_many_waiting_texts_as_slots_do_not_hold_an_ordinary_request(
        make_server: Callable[..., LiveServer]) -> None:
    """`max_batch` sessions whose texts wait hold every slot; an HTTP request is served while they are still open."""
    server = make_server(max_batch=2)
    worker = server.engine.worker
    assert worker is not None
    with connect(server.ws_url, max_size=None, open_timeout=30) as a, \
            connect(server.ws_url, max_size=None, open_timeout=30) as b, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        openings = []
        for conn, seed in ((a, 1), (b, 2)):
            session(conn, seed=seed)
            send(conn, "input_text_buffer.append", text="A slow writer has these words and")
            openings.append([recv(conn) for _ in OPENING])
        deadline = time.monotonic() + 30
        while sum(seq.starved for seq in list(worker.scheduler.running)) < 2:
            assert time.monotonic() < deadline, "the texts do not both wait"
            time.sleep(0.005)
        speak(http, "An ordinary request beside slow texts.")
        for conn, opening in ((a, openings[0]), (b, openings[1])):  # still open: their texts end only now
            send(conn, "input_text_buffer.append", text=" then no more.")
            send(conn, "input_text_buffer.commit")
            events, _ = until_done(conn)
            done = assert_sequence(opening + events, "completed")
            assert not [e for e in events if e["type"] == "error"]  # no input_text_timeout: it was still open
            assert done["output"][0]["content"][0]["transcript"] == "A slow writer has these words and then no more."
    assert not wait_no_leaks(server.url)

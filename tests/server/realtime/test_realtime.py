"""`WS /v1/realtime` with a websockets client: several responses, a cancel, bad events, disconnects."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from server.realtime import routes as routes_realtime
from server.realtime.routes import MAX_RESPONSES_PER_SESSION
from tests.server.conftest import API_KEY, LiveServer
from tests.server.realtime_client import (
    CLOSING,
    OPENING,
    assert_completed,
    assert_sequence,
    first_delta,
    recv,
    send,
    until_done,
)

LONG_TEXT = "This sentence keeps going on and on so that the audio lasts for a good while. " * 12


@pytest.fixture
def ws(live: LiveServer) -> Iterator[ClientConnection]:
    with connect(live.ws_url, max_size=None, open_timeout=30) as conn:
        created = recv(conn)
        assert created["type"] == "session.created"
        assert created["session"]["output_audio_format"] == "pcm16"
        send(conn, "session.update", session={"temperature": 0.0})  # greedy: the tiny model speaks to the end
        assert recv(conn)["type"] == "session.updated"
        yield conn



def test_session_update_and_responses_in_sequence(ws: ClientConnection) -> None:
    send(ws, "session.update", session={"voice": "ben", "output_audio_format": "pcm16", "seed": 3,
                                        "temperature": 0.0, "turn_detection": None})
    updated = recv(ws)
    assert updated["type"] == "session.updated" and updated["session"]["voice"] == "ben"

    send(ws, "input_text_buffer.append", text="Hello ")
    send(ws, "input_text_buffer.append", text="there, my friend.")
    send(ws, "input_text_buffer.commit")
    first_id = assert_completed(*until_done(ws))

    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there, my friend."}]}
    send(ws, "conversation.item.create", item=item)
    added, done = recv(ws), recv(ws)
    assert (added["type"], done["type"]) == ("conversation.item.added", "conversation.item.done")
    assert added["item"]["id"] == done["item"]["id"]
    assert added["item"]["content"][0]["text"] == item["content"][0]["text"]
    send(ws, "response.create")
    events, audio = until_done(ws)
    second_id = assert_completed(events, audio)
    assert second_id != first_id

    send(ws, "input_text_buffer.append", text="This is discarded.")
    send(ws, "input_text_buffer.clear")
    send(ws, "input_text_buffer.append", text="Hello there, my friend.")
    send(ws, "input_text_buffer.commit")
    _, again = until_done(ws)
    assert again == audio  # same text, seed and greedy sampling


def test_cancel_stops_within_a_step(live: LiveServer, ws: ClientConnection, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted in Talker steps, not time: once the server has turned the cancel into an abort, the request is in at
    most one more step (the one in flight, if it had started; the worker reads its inbox between steps)."""
    assert live.engine.worker is not None
    batches: list[set[str]] = []  # each step's request ids, appended by the worker
    aborted_at: dict[str, int] = {}  # request id → steps made before its abort
    abort = live.engine._abort

    def record_abort(request_id: str) -> None:
        aborted_at.setdefault(request_id, len(batches))
        abort(request_id)

    def record_step(stage: str, batch: tuple[Any, ...]) -> None:
        if stage == "step":
            batches.append({seq.request_id for seq in batch})

    monkeypatch.setattr(live.engine._submission, "abort", record_abort)  # a stream binds it when it is made
    live.engine.worker.fault_hook = record_step
    try:
        send(ws, "input_text_buffer.append", text=LONG_TEXT)
        send(ws, "input_text_buffer.commit")
        first_delta(ws)
        # its second chunk: frames made in steps (the first one's frame may come with the prefill), so it is
        # generating when the cancel comes (on a fast codec the first delta came after a single step)
        assert recv(ws)["type"] == "response.output_audio.delta"
        send(ws, "response.cancel")
        events, _ = until_done(ws)
        assert live.wait_idle(10.0)["slots_in_use"] == 0
    finally:
        live.engine.worker.fault_hook = None
    [(rid, at)] = aborted_at.items()
    assert sum(rid in b for b in batches[:at]) > 1  # it was generating
    assert sum(rid in b for b in batches[at:]) <= 1
    assert [e["type"] for e in events][-6:] == CLOSING
    done = events[-1]["response"]
    assert done["status"] == "cancelled" and done["output"][0]["status"] == "incomplete"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    send(ws, "input_text_buffer.append", text="Still here.")
    send(ws, "input_text_buffer.commit")
    assert_completed(*until_done(ws))


BAD_EVENTS: list[tuple[str, str]] = [
    ("not json", "{oops"),
    ("not an object", "[1, 2]"),
    ("unknown type", json.dumps({"type": "response.explode"})),
    ("missing type", json.dumps({"text": "hi"})),
    ("append without text", json.dumps({"type": "input_text_buffer.append"})),
    ("append wrong type", json.dumps({"type": "input_text_buffer.append", "text": 5})),
    ("commit empty buffer", json.dumps({"type": "input_text_buffer.commit"})),
    ("response without items", json.dumps({"type": "response.create"})),
    ("cancel without response", json.dumps({"type": "response.cancel"})),
    ("unsupported audio format", json.dumps({"type": "session.update", "session": {"output_audio_format": "g711"}})),
    ("unknown voice", json.dumps({"type": "session.update", "session": {"voice": "nobody"}})),
    ("a limit past any frame count", json.dumps({"type": "session.update", "session": {"max_output_tokens": 2**40}})),
    ("unknown voice in response", json.dumps({"type": "conversation.item.create", "item": {"type": "message",
     "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}}) + "\n"),
]


def test_the_server_declines_permessage_deflate(live: LiveServer) -> None:
    # the client offers it (websockets does by default); base64 audio is not worth compressing on the event loop
    with connect(live.ws_url, max_size=None, open_timeout=30) as conn:
        assert conn.response is not None
        assert "Sec-WebSocket-Extensions" not in conn.response.headers
        assert recv(conn)["type"] == "session.created"


def test_bad_events_answer_error_and_keep_the_session(ws: ClientConnection) -> None:
    for name, raw in BAD_EVENTS:
        ws.send(raw)
        if name == "unknown voice in response":  # the item is fine; the response's voice is not
            assert [recv(ws)["type"], recv(ws)["type"]] == ["conversation.item.added", "conversation.item.done"]
            send(ws, "response.create", response={"voice": "nobody"})
        event = recv(ws)
        assert event["type"] == "error", (name, event)
        assert event["error"]["type"] == "invalid_request_error" and event["error"]["message"]
    ws.send(b"binary")
    assert recv(ws)["type"] == "error"
    send(ws, "session.update", session={"voice": "alloy"})
    assert recv(ws)["type"] == "session.updated"
    send(ws, "input_text_buffer.clear")
    send(ws, "input_text_buffer.append", text="The session still works.")
    send(ws, "input_text_buffer.commit")
    assert_completed(*until_done(ws))


def test_second_response_while_active_is_an_error(ws: ClientConnection) -> None:
    send(ws, "input_text_buffer.append", text=LONG_TEXT[:300])
    send(ws, "input_text_buffer.commit")
    assert [recv(ws)["type"] for _ in OPENING] == OPENING
    send(ws, "input_text_buffer.append", text="More.")
    send(ws, "input_text_buffer.commit")
    events, _ = until_done(ws)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "conversation_already_has_active_response"
    assert events[-1]["response"]["status"] == "completed"


def test_a_session_creates_at_most_1000_responses(ws: ClientConnection) -> None:
    """The real limit, reached with responses cancelled as soon as they are created (1000 take about 2 s)."""
    statuses: dict[str, int] = {}
    for _ in range(MAX_RESPONSES_PER_SESSION):
        send(ws, "input_text_buffer.append", text="Hi.")
        send(ws, "input_text_buffer.commit")
        send(ws, "response.cancel")
        event = recv(ws)
        while event["type"] != "response.done":  # deltas, or an error: the response was over before the cancel
            assert event["type"] != "error" or event["error"]["code"] == "response_cancel_not_active", event
            event = recv(ws)
        statuses[event["response"]["status"]] = statuses.get(event["response"]["status"], 0) + 1
    assert sum(statuses.values()) == MAX_RESPONSES_PER_SESSION and set(statuses) <= {"cancelled", "completed"}
    send(ws, "input_text_buffer.append", text="One more.")
    send(ws, "input_text_buffer.commit")
    while (event := recv(ws))["type"] == "error" and event["error"]["code"] == "response_cancel_not_active":
        pass
    assert event["type"] == "error" and event["error"]["code"] == "session_response_limit", event
    send(ws, "session.update", session={"voice": "alloy"})  # the session itself goes on
    assert recv(ws)["type"] == "session.updated"


def test_disconnect_cancels_the_response(live: LiveServer) -> None:
    with connect(live.ws_url, max_size=None) as conn:
        recv(conn)
        send(conn, "session.update", session={"temperature": 0.0})
        recv(conn)
        send(conn, "input_text_buffer.append", text=LONG_TEXT)
        send(conn, "input_text_buffer.commit")
        first_delta(conn)
    stats = live.wait_idle(3.0)
    assert stats["active_requests"] == stats["slots_in_use"] == 0


def test_api_key_is_required(make_server: Callable[..., LiveServer]) -> None:
    server = make_server(api_key=API_KEY)
    with pytest.raises(InvalidStatus) as info:
        connect(server.ws_url, open_timeout=30)
    assert info.value.response.status_code == 401
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with connect(server.ws_url, additional_headers=headers, open_timeout=30) as conn:
        assert recv(conn)["type"] == "session.created"


def test_generation_failure_fails_only_that_response(make_server: Callable[..., LiveServer]) -> None:
    server = make_server()
    worker = server.engine.worker
    assert worker is not None
    armed = {"on": False}

    def hook(stage: str, batch: list[Any]) -> None:
        if stage == "step" and armed["on"]:
            armed["on"] = False
            raise RuntimeError("injected step failure")

    worker.fault_hook = hook
    with connect(server.ws_url, max_size=None) as conn:
        recv(conn)
        send(conn, "session.update", session={"temperature": 0.0})
        recv(conn)
        send(conn, "input_text_buffer.append", text=LONG_TEXT)
        send(conn, "input_text_buffer.commit")
        first_delta(conn)
        armed["on"] = True
        events, _ = until_done(conn)
        done = events[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "generation_error"
        send(conn, "input_text_buffer.append", text="Working again.")
        send(conn, "input_text_buffer.commit")
        assert_completed(*until_done(conn))
    worker.fault_hook = None


HOSTILE: list[tuple[str, str]] = [
    ("3,000 levels of nesting", '{"type": "session.update", "session": ' + "[" * 3000 + "]" * 3000 + "}"),
    ("a 5,000-digit integer", '{"type": "session.update", "session": {"seed": ' + "9" * 5000 + "}}"),
    ("a lone surrogate echoed", '{"type": "session.update", "session": {"voice": "\\ud800"}}'),
    ("a lone surrogate as the type", '{"type": "\\ud800"}'),
    ("a lone surrogate as event_id", '{"type": "nope", "event_id": "\\udfff"}'),
    ("a lone surrogate in text", '{"type": "input_text_buffer.append", "text": "a\\ud800b"}'),
]


def test_hostile_events_get_an_error_and_the_response_in_flight_still_ends(ws: ClientConnection) -> None:
    """None of these may end the session (they closed it with 1006 before), nor lose the response's done."""
    send(ws, "input_text_buffer.append", text=LONG_TEXT[:400])
    send(ws, "input_text_buffer.commit")
    first_delta(ws)
    for name, raw in HOSTILE:
        ws.send(raw)
        event = recv(ws)
        while event["type"] == "response.output_audio.delta":
            event = recv(ws)
        assert event["type"] == "error" and event["error"]["type"] == "invalid_request_error", (name, event)
    events, _ = until_done(ws)
    assert events[-1]["response"]["status"] == "completed"
    send(ws, "session.update", session={"voice": "alloy"})
    assert recv(ws)["type"] == "session.updated"


def test_the_ga_session_shape_is_applied_and_unsupported_fields_are_reported(ws: ClientConnection) -> None:
    session = {"type": "realtime", "output_modalities": ["audio"], "instructions": "Calmly.",
               "audio": {"output": {"voice": "ben", "format": {"type": "audio/pcm", "rate": 24000}}},
               "tools": [{"type": "function", "name": "f"}], "max_output_tokens": 5}
    send(ws, "session.update", session=session)
    updated = recv(ws)["session"]
    assert updated["type"] == "realtime" and updated["audio"]["output"]["voice"] == updated["voice"] == "ben"
    assert updated["instructions"] == "Calmly." and updated["max_output_tokens"] == 5
    report = recv(ws)
    assert report["type"] == "error" and report["error"]["code"] == "unsupported_field"
    assert report["error"]["param"] == "session.tools"
    send(ws, "input_text_buffer.append", text=LONG_TEXT[:200])
    send(ws, "input_text_buffer.commit")
    events, audio = until_done(ws)
    done = assert_sequence(events, "incomplete")  # the client's limit cut it: said, not hidden
    assert done["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    assert done["usage"]["output_tokens"] == 5 and done["output"][0]["status"] == "incomplete"
    assert len(audio) == 2 * 5 * 1920


def test_the_beta_session_shape_is_applied(ws: ClientConnection) -> None:
    """The README's beta names: voice, speed, output_audio_format "pcm16" and max_response_output_tokens."""
    send(ws, "session.update", session={"voice": "ben", "speed": 2.0, "output_audio_format": "pcm16",
                                        "max_response_output_tokens": 4})
    updated = recv(ws)
    assert updated["type"] == "session.updated" and updated["session"]["voice"] == "ben"
    send(ws, "input_text_buffer.append", text=LONG_TEXT[:200])
    send(ws, "input_text_buffer.commit")
    events, audio = until_done(ws)
    done = assert_sequence(events, "incomplete")
    assert done["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    assert done["usage"]["output_tokens"] == 4
    assert len(audio) == pytest.approx(2 * 4 * 1920 / 2.0, abs=2 * 240)  # 4 frames at twice the speed


def test_response_create_output_fields_apply_to_that_response_only(ws: ClientConnection) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_TEXT[:200]}]}
    send(ws, "conversation.item.create", item=item)
    assert [recv(ws)["type"] for _ in range(2)] == ["conversation.item.added", "conversation.item.done"]
    send(ws, "response.create", response={"max_output_tokens": 3})
    events, audio = until_done(ws)
    done = assert_sequence(events, "incomplete")
    assert done["usage"]["output_tokens"] == 3 and len(audio) == 2 * 3 * 1920
    send(ws, "conversation.item.create", item=item)
    assert [recv(ws)["type"] for _ in range(2)] == ["conversation.item.added", "conversation.item.done"]
    send(ws, "response.create")  # the session's settings again: no limit
    assert_completed(*until_done(ws))


def test_a_non_pcm_format_is_refused_and_a_text_only_session_is_reported(ws: ClientConnection) -> None:
    send(ws, "session.update", session={"audio": {"output": {"format": {"type": "audio/pcmu"}}}})
    assert recv(ws)["error"]["code"] == "invalid_event"
    send(ws, "session.update", session={"output_modalities": ["text"]})
    assert recv(ws)["type"] == "session.updated"
    assert recv(ws)["error"]["param"] == "session.output_modalities"


def test_session_instructions_and_speed_reach_the_response(live: LiveServer, ws: ClientConnection) -> None:
    def response(**session: object) -> tuple[dict[str, Any], bytes]:
        send(ws, "session.update", session=session)
        assert recv(ws)["type"] == "session.updated"
        send(ws, "input_text_buffer.append", text="Hello there, my friend.")
        send(ws, "input_text_buffer.commit")
        events, pcm = until_done(ws)
        assert_completed(events, pcm)
        return events[-1]["response"]["usage"], pcm

    plain, audio = response(seed=5)
    fast_usage, fast = response(audio={"output": {"speed": 2.0}})
    assert len(fast) / len(audio) == pytest.approx(0.5, abs=0.02)
    assert fast_usage["samples"] == len(fast) // 2 and fast_usage["output_tokens"] == plain["output_tokens"]
    calm, _ = response(instructions="Speak calmly.")
    tok = live.engine._loaded.frontend.tokenizer  # type: ignore[union-attr]
    assert calm["input_tokens"] - plain["input_tokens"] == len(tok.instruct("Speak calmly.")) > 0


def test_a_response_answered_at_once_finds_the_session_idle(ws: ClientConnection,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The next commit sent the moment `response.done` arrives is never refused as "still in progress": the session
    has released its response when that event leaves (it used to release it only after the send had returned, so a
    quick client could race it; seen with uvloop in a `talkstream serve` process)."""
    busy_at_done: list[bool] = []
    send_event = routes_realtime.Session.send

    async def watched(self: routes_realtime.Session, event: Any) -> bool:
        if getattr(event, "type", None) == "response.done":
            busy_at_done.append(self.active is not None)
        return await send_event(self, event)

    monkeypatch.setattr(routes_realtime.Session, "send", watched)
    send(ws, "session.update", session={"max_output_tokens": 2})
    assert recv(ws)["type"] == "session.updated"
    for i in range(10):
        send(ws, "input_text_buffer.append", text=f"Number {i}.")
        send(ws, "input_text_buffer.commit")
        events, _ = until_done(ws)
        assert not [e for e in events if e["type"] == "error"], events
    assert busy_at_done == [False] * 10

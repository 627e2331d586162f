"""A Realtime client for the tests: send and receive events, each received one checked against the official SDK's
model of it, and the checks of a whole response's event sequence."""

from __future__ import annotations

import base64
import json
import typing
from typing import Any

from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from websockets.sync.client import ClientConnection


def send(conn: ClientConnection, kind: str, **fields: Any) -> None:
    conn.send(json.dumps({"type": kind, **fields}))


def _sdk_models() -> dict[str, Any]:
    """The official SDK's model of each server event type (`openai.types.realtime`)."""
    union = typing.get_args(typing.get_args(RealtimeServerEvent)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in union}


SDK_EVENTS = _sdk_models()


def conforms(event: dict[str, Any]) -> None:
    """Every server event parses as the official SDK's model of its type, with every field it requires."""
    model = SDK_EVENTS.get(event["type"])
    assert model is not None, f"not an OpenAI Realtime server event: {event['type']}"
    model.model_validate(event, strict=False)


def recv(conn: ClientConnection, timeout: float = 30) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(conn.recv(timeout=timeout))
    conforms(event)
    return event


def until_done(conn: ClientConnection) -> tuple[list[dict[str, Any]], bytes]:
    """Events of one response up to and including response.done, and its decoded audio."""
    events = []
    while True:
        event = recv(conn)
        events.append(event)
        if event["type"] == "response.done":
            break
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    return events, audio


OPENING = ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added"]
CLOSING = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
           "response.output_item.done", "conversation.item.done", "response.done"]


def assert_sequence(events: list[dict[str, Any]], status: str) -> dict[str, Any]:
    """OpenAI's GA event sequence of one response: every item id is announced before a delta names it."""
    kinds = [e["type"] for e in events if e["type"] != "error"]
    assert kinds[:4] == OPENING and kinds[-6:] == CLOSING, kinds
    assert set(kinds[4:-6]) <= {"response.output_audio.delta"}
    rid, item = events[0]["response"]["id"], events[1]["item"]["id"]
    assert all(e.get("response_id", rid) == rid and e.get("item_id", item) == item for e in events)
    assert {e["item"]["id"] for e in events if "item" in e} == {item}
    done = events[-1]["response"]
    assert done["id"] == rid and done["status"] == status and done["output"][0]["id"] == item
    usage = done["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] and usage["input_tokens"] > 0
    return dict(done)


def first_delta(conn: ClientConnection) -> dict[str, Any]:
    """The opening events of a response, then its first audio delta."""
    assert [recv(conn)["type"] for _ in OPENING] == OPENING
    event = recv(conn)
    assert event["type"] == "response.output_audio.delta"
    return event


def assert_completed(events: list[dict[str, Any]], audio: bytes) -> str:
    done = assert_sequence(events, "completed")
    assert "status_details" not in done
    assert len(audio) == 2 * done["usage"]["samples"] > 0
    return str(done["id"])

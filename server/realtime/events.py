"""Reading one Realtime client event off the wire: whatever a client sends, the result is an event or an
`EventError` to answer with an `error` event (never an exception that could end the session)."""

from __future__ import annotations

import json

from pydantic import TypeAdapter, ValidationError

from server import errors
from server.realtime.protocol import ClientEvent

MAX_EVENT_CHARS = 64 * 1024  # one event; 4096 characters of text fit many times over
_events: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)


class EventError(Exception):
    def __init__(self, error: errors.ApiError, event_id: str | None = None) -> None:
        super().__init__(error.detail.message)
        self.error, self.event_id = error, event_id


def parse_event(text: str | None) -> ClientEvent:
    """A text frame → its client event. Raises EventError."""
    if text is None:
        raise EventError(errors.invalid("binary frames are not supported; send JSON text events",
                                        code="invalid_event"))
    if len(text) > MAX_EVENT_CHARS:
        raise EventError(errors.invalid(f"the event is larger than {MAX_EVENT_CHARS} characters",
                                        code="event_too_large"))
    try:
        data = json.loads(text)
    except RecursionError:
        raise EventError(errors.invalid("the event is nested too deeply", code="invalid_json")) from None
    except ValueError as exc:  # not JSON, or a number past Python's 4,300-digit limit
        raise EventError(errors.invalid(f"the event is not valid JSON: {str(exc)[:200]}",
                                        code="invalid_json")) from None
    event_id = data.get("event_id") if isinstance(data, dict) else None
    event_id = event_id if isinstance(event_id, str) and len(event_id) <= 256 else None
    try:
        return _events.validate_python(data)
    except ValidationError as exc:
        raise EventError(event_error(exc), printable(event_id)) from None
    except RecursionError:
        raise EventError(errors.invalid("the event is nested too deeply", code="invalid_event")) from None


def event_error(exc: ValidationError) -> errors.ApiError:
    first = exc.errors()[0]
    kind, loc = first["type"], [str(p) for p in first["loc"]]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return errors.invalid("unknown or missing event type: send one of the documented client events",
                              "type", "unknown_event")
    param = ".".join(loc[1:]) or None
    return errors.invalid(f"{param or 'event'}: {first['msg']}", printable(param), "invalid_event")


def printable(text: str | None) -> str | None:
    """A client's string echoed back, with anything that is not valid Unicode escaped."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")

"""The one place where failures become HTTP statuses and OpenAI error envelopes."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import EngineBusyError, EngineDeadError, RequestError, RequestFailedError
from server.protocol import ErrorDetail, ErrorEnvelope
from server.voices.db import QuotaExceededError, StorageError, StorageFullError

log = logging.getLogger("talkstream.server")

UNAVAILABLE_RETRY_AFTER_S = 5
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-]+){2,}")  # a file system path inside an exception's text


class ErrorType(StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    NOT_FOUND = "not_found_error"
    RATE_LIMIT = "rate_limit_error"
    SERVER = "server_error"


class ApiError(Exception):
    """An error with its HTTP status; raised by routes, turned into a response by the handlers below."""

    def __init__(
        self, status: int, message: str, type: ErrorType, param: str | None = None, code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        message, param = printable(message), None if param is None else printable(param)
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=type.value, param=param, code=code)
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after)))}

    def response(self) -> JSONResponse:
        body = ErrorEnvelope(error=self.detail).model_dump()
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def printable(text: str) -> str:
    """Text that can be sent: a client's lone surrogate echoed in a message is escaped, not a failed response."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, ErrorType.INVALID_REQUEST, param, code)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, ErrorType.AUTHENTICATION, code="invalid_api_key")


def forbidden(message: str, code: str) -> ApiError:
    return ApiError(403, message, ErrorType.INVALID_REQUEST, code=code)


def not_found(message: str, param: str, code: str) -> ApiError:
    """A named thing (a model, a voice, a consent recording) that is not here; an unknown path is `from_http`'s."""
    return ApiError(404, message, ErrorType.INVALID_REQUEST, param, code)


def conflict(message: str, param: str, code: str) -> ApiError:
    return ApiError(409, message, ErrorType.INVALID_REQUEST, param, code)


def too_large(message: str) -> ApiError:
    return ApiError(413, message, ErrorType.INVALID_REQUEST, code="body_too_large")


def upgrade_required(message: str) -> ApiError:
    return ApiError(426, message, ErrorType.INVALID_REQUEST, code="upgrade_required")


def internal(message: str) -> ApiError:
    return ApiError(500, message, ErrorType.SERVER, code="internal_error")


def busy(message: str, retry_after: float) -> ApiError:
    return ApiError(429, message, ErrorType.RATE_LIMIT, code="server_busy", retry_after=retry_after)


def unavailable(message: str, code: str = "engine_unavailable") -> ApiError:
    return ApiError(503, message, ErrorType.SERVER, code=code, retry_after=UNAVAILABLE_RETRY_AFTER_S)


# statuses that are not errors in OpenAI's envelope
CLIENT_CLOSED = 499  # nginx's status for a client that went away before the response
NOT_READY = 503  # GET /health of a server (or a Ray application) with no engine ready


def shutting_down() -> ApiError:
    """What a draining server answers to anything new (server/drain.py)."""
    return unavailable("the server is shutting down; retry shortly", code="server_shutting_down")


def from_exception(exc: BaseException) -> ApiError:
    """Maps engine and server exceptions onto API errors; anything unknown is a 500."""
    match exc:
        case ApiError():
            return exc
        case RequestFailedError():
            return ApiError(500, public(exc.message), ErrorType.SERVER, code=exc.code)
        case RequestError():
            return invalid(exc.message, exc.param, exc.code or "invalid_value")
        case EngineBusyError():
            return ApiError(429, str(exc), ErrorType.RATE_LIMIT, code="server_busy", retry_after=exc.retry_after_s)
        case EngineDeadError():
            return unavailable(str(exc))
        case QuotaExceededError():  # the client can make room: 507, as WebDAV's Insufficient Storage
            return ApiError(507, str(exc), ErrorType.INVALID_REQUEST, code=exc.code)
        case StorageFullError():
            return ApiError(507, str(exc), ErrorType.SERVER, code=exc.code)
        case StorageError():  # read-only, missing, damaged or locked: the voice library is unavailable
            return ApiError(503, str(exc), ErrorType.SERVER, code=exc.code)
        case _:
            return internal("internal error while generating speech")


def public(message: str) -> str:
    """A failure's message without internal paths or a traceback (it may quote an internal exception)."""
    return _PATH.sub("<path>", message.split("Traceback", 1)[0]).strip()[:500] or "internal error"


def from_validation(errors: Sequence[Any]) -> ApiError:
    """A 400 describing the first of pydantic's validation errors (never FastAPI's 422 shape)."""
    if not errors:
        return invalid("invalid request")
    first = errors[0]
    kind = first.get("type", "")
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if kind == "json_invalid":
        return invalid(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}",
                       code="invalid_json")
    if not loc:
        return invalid("the request body must be a JSON object (Content-Type: application/json)", code="invalid_body")
    param = str(loc[0])
    code = "missing_field" if kind == "missing" else "extra_field" if kind == "extra_forbidden" else "invalid_value"
    return invalid(f"{param}: {first['msg']}", param, code)


def from_http(exc: StarletteHTTPException) -> ApiError:
    if exc.status_code == 404:
        return ApiError(404, "not found", ErrorType.NOT_FOUND, code="not_found")
    if exc.status_code < 500:
        return ApiError(exc.status_code, str(exc.detail), ErrorType.INVALID_REQUEST, code=f"http_{exc.status_code}")
    return ApiError(exc.status_code, str(exc.detail), ErrorType.SERVER)


def install(app: FastAPI, on_error: Callable[[ApiError], None]) -> None:
    """Registers handlers so every error response is an OpenAI envelope; `on_error` sees each one (metrics)."""

    def respond(err: ApiError) -> JSONResponse:
        on_error(err)
        return err.response()

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        return respond(from_exception(exc))

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return respond(from_validation(exc.errors()))

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return respond(from_http(exc))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return respond(from_exception(exc))

    for known in (ApiError, RequestError, RequestFailedError, EngineBusyError, EngineDeadError, StorageError):
        app.add_exception_handler(known, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)

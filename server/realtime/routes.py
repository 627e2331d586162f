"""`WS /v1/realtime`: the text-to-speech subset of OpenAI's Realtime protocol.

One response at a time per socket; responses run in sequence. Errors are `error` events and never end the
session, whatever a client sends: bad JSON, deep nesting, huge numbers, lone surrogates, unknown events. A
disconnect cancels the response in flight. On shutdown (server/drain.py) new sessions are refused with 503, idle
ones are closed with 1012 and busy ones once their response is done (or cut at the shutdown timeout). A client that
stops reading has its connection aborted once a send outlasts `reader_timeout_s`. A plain HTTP GET gets 426.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse

from server import errors
from server.realtime.session import MAX_RESPONSES_PER_SESSION, SERVICE_RESTART, Session
from server.state import server_state

__all__ = ["MAX_RESPONSES_PER_SESSION", "Session", "router"]

router = APIRouter()


@router.websocket("/realtime")
async def realtime(ws: WebSocket) -> None:
    state = server_state(ws)  # its Host, key and Origin were checked by server/guard.py
    if state.draining:
        err = errors.shutting_down()
        state.metrics.error(err.detail.type, err.detail.code)
        await deny(ws, err, SERVICE_RESTART)
        return
    await ws.accept()
    await Session(ws, state).run()


@router.get("/realtime", include_in_schema=False)
async def realtime_over_http(_: Request) -> JSONResponse:
    err = errors.upgrade_required("/v1/realtime is a WebSocket endpoint: connect with a WebSocket client")
    response = err.response()
    response.headers.update({"Upgrade": "websocket", "Connection": "Upgrade"})
    return response


async def deny(ws: WebSocket, err: errors.ApiError, close_code: int = 1008) -> None:
    """An HTTP error instead of the upgrade where the server supports it, else a close (policy violation)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(JSONResponse({"error": err.detail.model_dump()}, status_code=err.status,
                                                   headers=err.headers))
    else:
        await ws.close(code=close_code, reason=err.detail.message[:120])

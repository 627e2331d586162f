"""FastAPI app factory: the lifespan starts and stops the engine; routes reach it through `ServerState`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from engine import Engine, EngineConfig, EngineState
from server import errors, routes_speech, web_page
from server.audio import decoder as audio_decoder
from server.drain import DrainGate
from server.guard import Guard, SitePolicy
from server.limits import BodyLimit
from server.metrics import CONTENT_TYPE, Metrics
from server.protocol import Health, ModelCard, ModelList
from server.realtime import routes as routes_realtime
from server.state import ServerState, server_state, state_of
from server.voices import routes as routes_voices
from server.voices.db import StorageError
from server.voices.store import Quota, VoiceStore, default_data_dir

log = logging.getLogger("talkstream.server")
DEAD_POLL_S = 0.5
DEAD_GRACE_S = 2.0  # lets the failed requests' clients get their errors before the process exits
EXIT_DEAD = 3
DOCS_ASSETS = "/docs-assets"


def create_app(
    config: EngineConfig | Sequence[EngineConfig], api_key: str | None = None, *, shutdown_timeout: float = 10.0,
    encode_threads: int = 4, exit_on_dead: bool = False, cors_origins: list[str] | None = None,
    log_input: bool = False, data_dir: Path | None = None, voice_quota: Quota | None = None,
    site: SitePolicy | None = None,
) -> FastAPI:
    """The Talkstream app, serving one model per config (each with an engine of its own; the first is the default).
    The engines load in the background, so `/health` answers 503 until all are ready.

    `exit_on_dead` (set by `talkstream serve`, never by in-process test servers): once an engine is dead the
    process exits with status 3 after a short grace period, so a supervisor restarts it. `data_dir`: where the voice
    library lives (server/voices/store.py; default `default_data_dir()`), and `voice_quota` what it may hold.
    `site`: the Hosts and origins the server answers (server/guard.py; default: a server on 127.0.0.1).
    """
    engines: dict[str, Engine] = {}
    for c in [config] if isinstance(config, EngineConfig) else config:
        engine = Engine(c)
        if engine.model_id in engines:
            raise ValueError(f"model '{engine.model_id}' is given twice")
        engines[engine.model_id] = engine
    state = ServerState(engines, Metrics(), ThreadPoolExecutor(encode_threads, "encoder"),
                        api_key or None, shutdown_timeout, log_input=log_input, exit_on_dead=exit_on_dead,
                        library=VoiceStore(data_dir or default_data_dir(), voice_quota))
    app = FastAPI(title="Talkstream", version="0.1.0", lifespan=_lifespan, docs_url=None, redoc_url=None,
                  description="Streaming text-to-speech, compatible with OpenAI's speech and Realtime APIs.")
    app.state.talkstream = state
    app.add_middleware(BodyLimit)
    # the Host, the key and the Origin, before anything reads a body; inside CORS, so its errors carry CORS headers
    app.add_middleware(Guard, state=state, policy=site or SitePolicy(), cors_origins=cors_origins or ())
    if cors_origins:  # off unless configured
        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(DrainGate, state=state)  # outermost: nothing new gets in while draining
    errors.install(app, lambda err: state.metrics.error(err.detail.type, err.detail.code))
    app.include_router(_public_router())
    _add_docs(app)
    web_page.add_page(app)  # GET /: a page that speaks a text while it streams (server/web_page.py)
    v1 = APIRouter(prefix="/v1")  # the key is checked by Guard
    v1.include_router(_listing_router())
    v1.include_router(routes_speech.router)
    v1.include_router(routes_voices.router)
    app.include_router(v1)
    app.include_router(routes_realtime.router, prefix="/v1")
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state = state_of(app)
    state.start_task = asyncio.create_task(_start_engine(state), name="engine-start")
    watchdog = asyncio.create_task(_exit_when_dead(state), name="dead-watchdog") if state.exit_on_dead else None
    audio_decoder.POOL.open()  # its processes start with the first upload; closed in _stop_engine
    try:
        yield
    finally:
        if watchdog is not None:
            watchdog.cancel()
        await _stop_engine(state)


async def _exit_when_dead(state: ServerState) -> None:
    while state.start_task is None or not state.start_task.done() or state.status != EngineState.DEAD.value:
        await asyncio.sleep(DEAD_POLL_S)
    log.critical("an engine is dead (%s); exiting in %.0f s so a supervisor can restart the server",
                 state.dead_reason, DEAD_GRACE_S)
    await asyncio.sleep(DEAD_GRACE_S)
    logging.shutdown()
    os._exit(EXIT_DEAD)  # threads may be hung (that can be why it died): do not wait for them


async def _start_engine(state: ServerState) -> None:
    try:
        for model, engine in state.engines.items():  # one after another: one model's load peak at a time
            await engine.start()
            memory = engine.memory()
            log.info("engine ready: model %s, %d voices; %.1f MiB of Talker weights, %.1f MiB of KV cache, "
                     "%.1f MiB per request", model, len(engine.voices), memory.get("weights_bytes", 0) / 2**20,
                     memory.get("kv_cache_bytes", 0) / 2**20, memory.get("bytes_per_request", 0) / 2**20)
        # The model and the libraries make a large heap that never becomes garbage; a full collection scanning it
        # paused the loop for 172 ms at 32 streams. Frozen objects are left out of every later collection.
        gc.collect()
        gc.freeze()
    except Exception as exc:
        state.start_error = f"{type(exc).__name__}: {exc}"
        log.exception("an engine failed to start")


async def _stop_engine(state: ServerState) -> None:
    task = state.start_task
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    try:
        await asyncio.gather(*(e.drain(state.shutdown_timeout) for e in state.engines.values()))
    finally:
        for engine in state.engines.values():
            await engine.stop()
        await asyncio.to_thread(state.executor.shutdown, wait=True)
        await asyncio.to_thread(audio_decoder.POOL.close)
        state.library.close()


def _public_router() -> APIRouter:
    router = APIRouter()

    @router.get("/health", response_model=Health, responses={errors.NOT_READY: {"model": Health}})
    async def health(request: Request) -> JSONResponse:
        state = server_state(request)
        status = state.status
        body = Health(status=status, model=state.engine.model_id, detail=state.dead_reason,
                      models={m: e.state.value for m, e in state.engines.items()})
        if status == EngineState.READY.value:
            return JSONResponse(body.model_dump())
        retry = {"Retry-After": str(errors.UNAVAILABLE_RETRY_AFTER_S)}
        return JSONResponse(body.model_dump(), status_code=errors.NOT_READY, headers=retry)

    @router.get("/metrics", response_class=Response)
    async def metrics(request: Request) -> Response:
        state = server_state(request)
        with contextlib.suppress(StorageError):  # an unreadable library leaves its gauges as they were
            state.metrics.library(await asyncio.to_thread(state.library.usage), state.library.quota)
        return Response(state.metrics.scrape(list(state.engines.values())), media_type=CONTENT_TYPE)

    return router


def _add_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc with their scripts served from here, not from FastAPI's default CDN, so they
    work offline. The files come from the `fastapi-offline` package; only its static files are used."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=Path(str(resources.files("fastapi_offline") / "static"))),
              name="docs-assets")
    router = APIRouter(include_in_schema=False)

    @router.get("/docs")
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
                                   swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png", oauth2_redirect_url=None,
                                   swagger_ui_parameters={"validatorUrl": None})  # no call to an online validator

    @router.get("/redoc")
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png", with_google_fonts=False)

    app.include_router(router)


def _listing_router() -> APIRouter:
    router = APIRouter()

    @router.get("/models", response_model=ModelList)
    async def models(request: Request) -> ModelList:
        state = server_state(request)
        return ModelList(data=[ModelCard(id=m, timestamps=state.engine_for(m).timestamps)
                               for m in state.served_models()])

    return router


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated schema, minus FastAPI's 422 responses: validation errors are 400 here."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for op in path.values():
                op.get("responses", {}).pop("422", None)
        app.openapi_schema = schema
    return app.openapi_schema

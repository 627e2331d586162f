"""What routes share: the engine, metrics, the encoder executor, the API key and the voice library. Lives on
`app.state`."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import FastAPI
from starlette.requests import HTTPConnection

from engine import Engine, EngineState
from server import errors
from server.metrics import Metrics
from server.protocol import MODEL_ALIASES
from server.voices.store import VoiceStore, default_data_dir

log = logging.getLogger("talkstream.server")


class OpenSpeech(Protocol):
    """An HTTP speech response in flight (`routes_speech.Speech`)."""

    def cut(self, err: errors.ApiError) -> None: ...


class OpenSession(Protocol):
    """A Realtime session (`realtime_session.Session`)."""

    @property
    def busy(self) -> bool: ...

    async def drain(self) -> None: ...

    async def cut(self, err: errors.ApiError) -> None: ...

    def abort(self) -> None: ...


@dataclass
class ServerState:
    engines: dict[str, Engine]  # by served model id; the first is the default (and what OpenAI's names mean)
    metrics: Metrics
    executor: ThreadPoolExecutor
    api_key: str | None = None
    shutdown_timeout: float = 10.0
    log_input: bool = False  # input text is logged only when asked for
    exit_on_dead: bool = False
    start_error: str | None = None
    start_task: asyncio.Task[None] | None = field(default=None, repr=False)
    draining: bool = False  # shutting down: new requests get 503, sessions close with 1012 (server/drain.py)
    speeches: set[OpenSpeech] = field(default_factory=set, repr=False)
    sessions: set[OpenSession] = field(default_factory=set, repr=False)
    library: VoiceStore = field(default_factory=lambda: VoiceStore(default_data_dir()), repr=False)  # created voices

    @property
    def engine(self) -> Engine:
        """The first (default) model's engine."""
        return next(iter(self.engines.values()))

    def engine_for(self, model: str | None) -> Engine:
        """The engine serving `model`: one of the served ids, or an OpenAI model name (the first model)."""
        if model is None or model in MODEL_ALIASES or model.startswith("gpt-4o-mini-tts-"):
            return self.engine
        engine = self.engines.get(model)
        if engine is None:
            raise errors.not_found(f"the model '{model}' does not exist here; this server serves "
                                   f"{', '.join(self.served_models())}", "model", "model_not_found")
        return engine

    def in_flight(self) -> int:
        """Responses still being produced or sent, over HTTP and WebSocket."""
        return len(self.speeches) + sum(1 for s in self.sessions if s.busy)

    @property
    def status(self) -> str:
        """The engine's state, except that the server is `starting` until the engine's warm-up is over."""
        if self.start_error is not None:
            return EngineState.DEAD.value
        if self.start_task is None or not self.start_task.done():  # loading, or warming up (engine already READY)
            return EngineState.STARTING.value
        states = [e.state for e in self.engines.values()]
        worst = next((s for s in states if s is not EngineState.READY), EngineState.READY)
        return EngineState.DEAD.value if EngineState.DEAD in states else worst.value

    @property
    def dead_reason(self) -> str | None:
        return self.start_error or next((f"{m}: {e.dead_reason}" for m, e in self.engines.items() if e.dead_reason),
                                        None)

    def served_models(self) -> list[str]:
        return [*self.engines, *MODEL_ALIASES]

    def check_model(self, model: str) -> None:
        self.engine_for(model)

    @property
    def has_lexicon(self) -> bool:
        return any(e.config.lexicon for e in self.engines.values())

    async def reload_lexicons(self) -> None:
        """Each engine reads its lexicon file again (SIGHUP); one that cannot be used leaves the one in use."""
        for model, engine in self.engines.items():
            try:
                entries = await asyncio.to_thread(engine.reload_lexicon)
            except Exception as exc:
                log.error("model %s keeps the lexicon it had: %s", model, exc)
            else:
                if entries is not None:
                    log.info("model %s reloaded its lexicon: %d entries", model, entries)


def state_of(app: FastAPI) -> ServerState:
    state: ServerState = app.state.talkstream
    return state


def server_state(conn: HTTPConnection) -> ServerState:
    return state_of(conn.app)

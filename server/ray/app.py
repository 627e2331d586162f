"""Talkstream on Ray Serve: replicas that each hold one engine (one device), behind Ray Serve's proxy.

Each replica runs the same FastAPI app as `talkstream serve` (`server/app.py`), so the HTTP API and the Realtime
WebSocket are the same; Ray's proxy passes chunked responses and WebSockets through as they come.

- Routing: `max_ongoing_requests` is a replica's admission limit (`max_batch + max_queue` over its models), so Ray's
  router never sends a request to a replica that is full while another has room; past every replica's limit,
  requests wait at the proxy (up to `max_queued_requests`, then 429 with Retry-After, as one full server answers).
  Ray counts a request as queued from its arrival until its replica is picked, so that bound must also take a
  burst: it defaults to one replica's limit.
  A Realtime session is one request for as long as its socket is open, idle or not: it holds its slot throughout.
- Health: `check_health` raises once the replica's engine is dead; Ray then stops the replica and starts another.
  The dead engine fails its in-flight streams at once (truncated HTTP bodies, `error` events); after a grace for
  those to reach their clients, the replica drains (server/drain.py): sessions close with 1012 and reconnect to a
  live replica.
- Autoscaling (optional): on the engines' in-flight streams, which each replica reports
  (`record_autoscaling_stats`); `streams_policy` wants enough replicas for `target_streams` each.
- Views: `/health` and `/metrics` are the answering replica's (`x-talkstream-replica` names it). The `Registry`, an
  application of its own at `/replicas`, keeps every replica's last report and answers `/replicas/health` and
  `/replicas/metrics` for the whole application (server/ray/views.py), without a slot on any replica.

Ray is an optional extra (`pip install talkstream[ray]`): only this module imports it, and only `talkstream serve
--ray` (server/ray/cli.py), `serve run` / KubeRay (`build`, `build_registry`) and the tests import this module.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import UnionType
from typing import Any, Union, cast, get_args, get_origin, get_type_hints

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.serve.config import AutoscalingContext
from ray.serve.deployment import Deployment
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine import EngineConfig, EngineState
from server.app import DEAD_GRACE_S, create_app
from server.drain import drain
from server.guard import SitePolicy
from server.metrics import CONTENT_TYPE
from server.ray import views as ray_views
from server.state import ServerState, state_of
from server.voices.db import Quota

log = logging.getLogger("talkstream.ray")
APP_NAME = "talkstream"  # at /
REGISTRY_APP = "talkstream-replicas"  # at /replicas
DEPLOYMENT, REGISTRY = "Talkstream", "TalkstreamRegistry"
REPLICA_HEADER = "x-talkstream-replica"
STREAMS_METRIC = "streams"  # the custom autoscaling metric: a replica's in-flight engine streams
DEAD_POLL_S = 0.2
REPORT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class RayOptions:
    """How the engines are laid out on Ray; the engines' own settings stay in each EngineConfig."""

    replicas: int = 1
    max_replicas: int | None = None  # above `replicas`: autoscale between the two on in-flight streams
    target_streams: float | None = None  # streams per replica the autoscaler aims at (default: max_batch)
    num_cpus: float = 1.0  # logical CPUs Ray reserves per replica
    num_gpus: float = 0.0  # 1 on CUDA: each replica gets a GPU of its own (Ray sets CUDA_VISIBLE_DEVICES)
    # per proxy: requests waiting for a replica, those whose replica is being picked included, so it must take a
    # burst (Ray refuses past it, server/ray/app.py); default: one replica's admission limit
    max_queued_requests: int | None = None
    # how often Ray asks a replica whether its engine is alive; Ray stops it after 3 failed checks in a row
    health_period_s: float = 1.0
    report_period_s: float = 1.0  # how often a replica tells the registry its health and metrics
    registry_app: str = REGISTRY_APP
    api_key: str | None = None
    shutdown_timeout: float = 10.0
    data_dir: Path | None = None  # the voice library's: each replica has its own unless they share this directory
    voice_storage_quota: int | None = None  # what each replica's voice library may hold (server/voice_db.Quota)
    max_voices: int | None = None
    cors_origins: tuple[str, ...] = ()
    # the Hosts and origins served (server/guard.py): the proxy's address decides the default Hosts; any Host by
    # default, since `serve run` and KubeRay bind it where they choose (`talkstream serve --ray` passes --host)
    bind_host: str = "0.0.0.0"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    log_input: bool = False

    def validate(self) -> RayOptions:
        if self.replicas < 1 or (self.max_replicas is not None and self.max_replicas < self.replicas):
            raise ValueError("replicas must be >= 1, and max_replicas >= replicas")
        if min(self.health_period_s, self.report_period_s) <= 0 or min(self.num_cpus, self.num_gpus) < 0:
            raise ValueError("the periods must be > 0 and the resources >= 0")
        return self


def admission_limit(configs: Sequence[EngineConfig]) -> int:
    """Requests a replica takes before its engines refuse more: what Ray may have in flight there."""
    return sum(c.max_batch + c.max_queue for c in configs)


class ReplicaHeader:
    """Names the replica in every HTTP response and WebSocket handshake, so a client knows whose view it got."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def named(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named if scope["type"] in ("http", "websocket") else send)


views = FastAPI(title="Talkstream replicas", docs_url=None, redoc_url=None, openapi_url=None)


@serve.deployment(name=REGISTRY, num_replicas=1, ray_actor_options={"num_cpus": 0},
                  logging_config={"enable_access_log": False})  # a report a second from each replica
@serve.ingress(views)
class Registry:
    """Each replica's last report (server/ray/views.py), and the application's views made from them."""

    def __init__(self, stale_s: float) -> None:
        self.reports = ray_views.Reports(stale_s)

    def report(self, replica: str, report: dict[str, Any] | None) -> None:
        if report is None:  # the replica stopped
            self.reports.drop(replica)
        else:
            self.reports.put(replica, report)

    @views.get("/health")
    def health(self) -> JSONResponse:
        status, body = ray_views.app_health(self.reports.current())
        return JSONResponse(body, status_code=status)

    @views.get("/metrics")
    def metrics(self) -> Response:
        return Response(ray_views.app_metrics(self.reports.current()), media_type=CONTENT_TYPE)


@serve.deployment(name=DEPLOYMENT)
@serve.ingress()
class Replica:
    """One engine per replica (one per model), serving the whole Talkstream app."""

    def __init__(self, configs: list[EngineConfig], options: RayOptions) -> None:
        self.configs, self.options = configs, options
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.registry = serve.get_deployment_handle(REGISTRY, app_name=options.registry_app)
        self.state: ServerState | None = None
        self._unreported = False

    def __serve_build_asgi_app__(self) -> ASGIApp:
        opts = self.options
        app = create_app(self.configs, opts.api_key, shutdown_timeout=opts.shutdown_timeout, data_dir=opts.data_dir,
                         cors_origins=list(opts.cors_origins) or None, log_input=opts.log_input,
                         voice_quota=Quota.from_env(opts.voice_storage_quota, opts.max_voices),
                         site=SitePolicy(opts.bind_host, opts.allowed_hosts, opts.allowed_origins))
        self.state = state_of(app)
        inner = app.router.lifespan_context
        app.router.lifespan_context = lambda a: self._lifespan(a, inner)
        return ReplicaHeader(app, self.replica)

    @asynccontextmanager
    async def _lifespan(self, app: FastAPI, inner: Callable[[FastAPI], AbstractAsyncContextManager[Any]]
                        ) -> AsyncIterator[None]:
        """The app's own lifespan, which starts the engines in the background, then a wait for them: Ray counts a
        replica as running (and routes to it) once this returns, so no request meets an engine still loading."""
        async with inner(app):
            state = state_of(app)
            assert state.start_task is not None
            await asyncio.shield(state.start_task)
            if state.start_error is not None:  # Ray retries the replica
                raise RuntimeError(f"the engine did not start: {state.start_error}")
            tasks = [asyncio.create_task(self._report_every_period(state), name="ray-report"),
                     asyncio.create_task(self._drain_when_dead(state), name="ray-dead-drain")]
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self._report(None)

    async def check_health(self) -> None:
        """Ray's health check: a dead engine makes the replica unhealthy, and Ray replaces it."""
        if self.state is not None and self.state.status == EngineState.DEAD.value:
            raise RuntimeError(f"the engine is dead: {self.state.dead_reason}")

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """The engines' in-flight streams (running or queued): what `streams_policy` scales on. Idle Realtime
        sessions are not streams, though Ray counts them as ongoing requests."""
        return {STREAMS_METRIC: float(_streams(self.state)) if self.state else 0.0}

    async def _report_every_period(self, state: ServerState) -> None:
        while True:
            await self._report(self._view(state))
            await asyncio.sleep(self.options.report_period_s)

    async def _report(self, view: dict[str, Any] | None) -> None:
        try:  # bounded: a call to a registry that is gone may wait for one to appear (a replica stopping last)
            await asyncio.wait_for(self.registry.report.remote(self.replica, view), REPORT_TIMEOUT_S)
            self._unreported = False
        except Exception as exc:  # the registry is starting, being replaced, or not deployed: try next period
            if not self._unreported:
                log.warning("cannot report to the registry (application %r): %r", self.options.registry_app, exc)
            self._unreported = True

    def _view(self, state: ServerState) -> dict[str, Any]:
        return {"status": state.status, "detail": state.dead_reason, "pid": os.getpid(),
                "models": {m: e.state.value for m, e in state.engines.items()}, "in_flight": state.in_flight(),
                "streams": _streams(state), "limit": admission_limit(self.configs),
                "metrics": state.metrics.scrape(list(state.engines.values())).decode()}

    async def _drain_when_dead(self, state: ServerState) -> None:
        """Once the engine is dead: report it now, give the failed streams' errors time to reach their clients,
        then drain, so open sessions close (1012) and reconnect elsewhere while Ray replaces this replica."""
        while state.status != EngineState.DEAD.value:
            await asyncio.sleep(DEAD_POLL_S)
        log.error("the engine is dead (%s): draining this replica; Ray replaces it", state.dead_reason)
        await self._report(self._view(state))
        await asyncio.sleep(DEAD_GRACE_S)
        await drain(state, 0)


def _streams(state: ServerState) -> int:
    return sum(e.active_requests() for e in state.engines.values())


def streams_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    """Replicas wanted: the in-flight streams over all replicas (averaged over Ray's look-back window) divided by
    `target_ongoing_requests`, which here means streams per replica. Ray applies the bounds and the delays."""
    per_replica = (ctx.aggregated_metrics or {}).get(STREAMS_METRIC)
    if not per_replica:  # no report yet (replicas starting): keep what there is
        return ctx.target_num_replicas, {}
    assert ctx.config is not None  # a deployment with a policy has its autoscaling config
    return max(1, math.ceil(sum(per_replica.values()) / ctx.config.get_target_ongoing_requests())), {}


def build_app(configs: Sequence[EngineConfig], options: RayOptions) -> Any:
    """The Talkstream application, to be run at `/` (`deploy` runs it with its registry)."""
    configs = [c.validate() for c in configs]
    return _deployment(Replica).options(**deployment_settings(configs, options)).bind(configs, options.validate())


def deployment_settings(configs: Sequence[EngineConfig], options: RayOptions) -> dict[str, Any]:
    """The replicas' Serve settings: routing by admission limit, health, resources, and scaling."""
    opts, first, limit = options.validate(), configs[0], admission_limit(configs)
    settings: dict[str, Any] = {
        "max_ongoing_requests": limit,
        "max_queued_requests": limit if opts.max_queued_requests is None else opts.max_queued_requests,
        "backpressure_config": {"status_code": 429, "retry_after_s": 1},  # as one full server answers
        "ray_actor_options": {"num_cpus": opts.num_cpus, "num_gpus": opts.num_gpus},
        "health_check_period_s": opts.health_period_s,
        "graceful_shutdown_timeout_s": opts.shutdown_timeout + DEAD_GRACE_S,
    }
    if opts.max_replicas is not None and opts.max_replicas > opts.replicas:
        settings["autoscaling_config"] = {
            "min_replicas": opts.replicas, "max_replicas": opts.max_replicas,
            "target_ongoing_requests": opts.target_streams or first.max_batch,
            "policy": {"policy_function": f"{__name__}:streams_policy"}}
    else:
        settings["num_replicas"] = opts.replicas
    return settings


def build_registry_app(options: RayOptions) -> Any:
    """The registry application, to be run at `/replicas` under `options.registry_app`."""
    return _deployment(Registry).bind(ray_views.STALE_PERIODS * options.report_period_s)


def deploy(configs: Sequence[EngineConfig], options: RayOptions, blocking: bool = False) -> None:
    """Runs both applications on the connected Ray cluster (its Serve instance started by the caller); returns
    once every replica's engine is ready."""
    serve.run(build_registry_app(options), name=options.registry_app, route_prefix="/replicas")
    serve.run(build_app(configs, options), name=APP_NAME, route_prefix="/", blocking=blocking)


def build(args: dict[str, Any]) -> Any:
    """For `serve run` / `serve deploy` / KubeRay (`import_path: server.ray.app:build`): engine settings as in
    `talkstream serve` (`model` a comma-separated list, and TALKSTREAM_* variables), the rest RayOptions' fields."""
    args = dict(args)
    models = str(args.pop("model", "tiny")).split(",")
    engine_keys = {"revision", "device", "dtype", "quantize", "max_batch", "max_queue", "output_mode"}
    engine = _typed(EngineConfig, {k: args.pop(k) for k in list(args) if k in engine_keys})
    options = RayOptions(**_typed(RayOptions, args))
    if options.api_key is None:
        options = replace(options, api_key=os.environ.get("TALKSTREAM_API_KEY") or None)
    env = SitePolicy.from_settings(options.bind_host)  # TALKSTREAM_ALLOWED_* where the arguments give none
    options = replace(options, allowed_hosts=options.allowed_hosts or env.hosts,
                      allowed_origins=options.allowed_origins or env.origins)
    return build_app([EngineConfig.from_env(model=m, **engine) for m in models], options)


def build_registry(args: dict[str, Any]) -> Any:
    """For `serve run` / KubeRay (`import_path: server.ray.app:build_registry`, `route_prefix: /replicas`)."""
    return build_registry_app(RayOptions(**_typed(RayOptions, dict(args))))


def _deployment(decorated: object) -> Deployment:
    """What `@serve.deployment` made of a class (its stubs say the class itself)."""
    return cast(Deployment, decorated)


def _typed(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """`serve run` passes every argument as a string: each becomes its field's type (the one that is not None)."""
    hints = get_type_hints(cls)
    out = {}
    for key, value in raw.items():
        if key not in hints:
            raise ValueError(f"unknown argument {key!r}")
        kind = _kind(hints[key])
        if isinstance(value, str) and kind is not str:
            value = (value.strip().lower() in ("1", "true", "yes", "on") if kind is bool
                     else tuple(v.strip() for v in value.split(",") if v.strip()) if kind is tuple else kind(value))
        out[key] = value
    return out


def _kind(hint: Any) -> Any:
    """`int | None` → int, `tuple[str, ...]` → tuple."""
    origin = get_origin(hint)
    if origin in (Union, UnionType):
        return _kind(next(t for t in get_args(hint) if t is not type(None)))
    return origin or hint

"""`talkstream serve --ray`: the same server as replicas on Ray Serve (server/ray/app.py), one engine each.

Without `--ray-address` (or RAY_ADDRESS) it starts a Ray instance on this machine; with one it joins that cluster.
Either way it starts Serve's proxy on --host/--port, deploys the applications and serves until SIGINT or SIGTERM,
then deletes them (and stops the Ray instance it started). Ray is an optional extra: without it, `--ray` is a
one-line error and nothing else changes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
from typing import TYPE_CHECKING

from engine import EngineConfig

if TYPE_CHECKING:
    from server.ray.app import RayOptions

MISSING = "--ray needs Ray Serve, which is not installed: pip install 'talkstream[ray]'"


def add_flags(serve: argparse.ArgumentParser) -> None:
    ray = serve.add_argument_group("Ray Serve (--ray; README: Scaling out on Ray Serve)")
    ray.add_argument("--ray", action="store_true", help="serve replicas on Ray Serve, one engine (device) each")
    ray.add_argument("--replicas", type=int, default=1, help="replicas (the minimum when autoscaling)")
    ray.add_argument("--max-replicas", type=int, default=None,
                     help="autoscale between --replicas and this on the engines' in-flight streams")
    ray.add_argument("--target-streams", type=float, default=None,
                     help="in-flight streams per replica the autoscaler aims at (default: --max-batch)")
    ray.add_argument("--gpus-per-replica", type=float, default=None,
                     help="default: 1 with --device cuda, else 0 (auto: 1 where the cluster has GPUs)")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0, help="logical CPUs Ray reserves per replica")
    ray.add_argument("--ray-address", default=None,
                     help="an existing Ray cluster (default: RAY_ADDRESS, else a new one on this machine)")


def serve(args: argparse.Namespace, configs: list[EngineConfig], api_key: str | None,
          cors_origins: list[str] | None) -> int:
    try:
        import ray
        from ray import serve as ray_serve

        from server.ray import app as ray_app
    except ImportError as exc:
        raise ValueError(MISSING) from exc
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address)
    else:  # this machine's own instance: no dashboard (a web server of its own, on another port)
        ray.init(include_dashboard=False)
    # SIGTERM as SIGINT: either stops the deployment (or its wait), then the applications are deleted. Set after
    # ray.init, whose crash handler takes SIGTERM for itself (it logs, then aborts the process).
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        options = ray_options(args, configs, api_key, ray.cluster_resources().get("GPU", 0) > 0, cors_origins)
        ray_serve.start(http_options={"host": args.host, "port": args.port})
        with contextlib.suppress(KeyboardInterrupt):
            ray_app.deploy(configs, options)
            logging.getLogger("talkstream.ray").info(
                "serving %d replica(s) on http://%s:%d (Ctrl-C to stop)", options.replicas, args.host, args.port)
            _wait_for_a_signal()
        for name in (ray_app.APP_NAME, options.registry_app):  # in flight: up to --shutdown-timeout to finish
            ray_serve.delete(name)
    finally:
        if address is None:
            ray_serve.shutdown()
        ray.shutdown()
        signal.signal(signal.SIGTERM, previous)
    return 0


def ray_options(args: argparse.Namespace, configs: list[EngineConfig], api_key: str | None,
                cluster_has_gpus: bool, cors_origins: list[str] | None = None) -> RayOptions:
    from server.guard import SitePolicy
    from server.ray.app import RayOptions

    site = SitePolicy.from_settings(args.host, args.allowed_hosts, args.allowed_origins)
    gpus = args.gpus_per_replica
    if gpus is None:  # one device per replica: a GPU of its own on CUDA
        devices = {c.device for c in configs}
        gpus = 1.0 if any(d.startswith("cuda") for d in devices) or (devices == {"auto"} and cluster_has_gpus) else 0.0
    return RayOptions(replicas=args.replicas, max_replicas=args.max_replicas, target_streams=args.target_streams,
                      num_cpus=args.cpus_per_replica, num_gpus=gpus, api_key=api_key,
                      shutdown_timeout=args.shutdown_timeout, data_dir=args.data_dir, log_input=args.log_input,
                      voice_storage_quota=args.voice_storage_quota, max_voices=args.max_voices,
                      cors_origins=tuple(cors_origins or ()), bind_host=site.bind, allowed_hosts=site.hosts,
                      allowed_origins=site.origins).validate()


def _wait_for_a_signal() -> None:
    """Until SIGINT or SIGTERM (KeyboardInterrupt, both)."""
    threading.Event().wait()

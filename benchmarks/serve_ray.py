"""`talkstream bench serve --ray-replicas 1,2`: the same load as `bench serve`, against Talkstream on Ray Serve
(server/ray/app.py) with each replica count in turn, on a Ray instance this benchmark starts on this machine.

Each count is deployed, waited for (every replica's engine ready and reporting), loaded with the same levels as
`bench serve`, then deleted before the next. The engines' settings come from TALKSTREAM_* variables (default:
`tiny` on the CPU); each replica reserves `--ray-cpus` logical CPUs and `--ray-gpus` GPUs. Needs the [ray] extra.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

from engine import EngineConfig

READY_TIMEOUT_S = 300.0


def replica_counts(text: str) -> list[int]:
    counts = [int(n) for n in text.split(",") if n.strip()]
    if not counts or min(counts) < 1:
        raise ValueError("--ray-replicas takes replica counts >= 1, e.g. 1,2")
    return counts


def run(args: argparse.Namespace, bench: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]
        ) -> dict[str, Any]:
    """`bench` (benchmarks/serve.py) against each replica count; one result per count."""
    import ray
    from ray import serve

    from server.ray import app as ray_app

    counts = replica_counts(args.ray_replicas)
    config = EngineConfig.from_env()
    port = _free_port()
    ray.init(num_cpus=max(max(counts) * args.ray_cpus, 1), include_dashboard=False, log_to_driver=False)
    runs = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for n in counts:
            options = ray_app.RayOptions(replicas=n, num_cpus=args.ray_cpus, num_gpus=args.ray_gpus,
                                         api_key=args.api_key)
            ray_app.deploy([config], options)
            args.url = f"http://127.0.0.1:{port}"
            _wait_for_replicas(args.url, n)
            print(f"== {n} replica(s) of {config.model} on Ray Serve", flush=True)
            runs.append({"replicas": n, **asyncio.run(bench(args))})
            for name in (ray_app.APP_NAME, options.registry_app):
                serve.delete(name)
    finally:
        serve.shutdown()
        ray.shutdown()
    return {"bench": "serve", "ray": True, "model": config.model, "runs": runs}


def _wait_for_replicas(url: str, n: int) -> None:
    """Every replica ready and reporting (`serve.run` returns once they are running; reports follow)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        with_status = httpx.get(url + "/replicas/health", timeout=10).json()
        if with_status["ready_replicas"] == len(with_status["replicas"]) == n:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{n} replica(s) did not become ready")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

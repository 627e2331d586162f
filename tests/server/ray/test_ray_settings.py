"""How Talkstream is laid out on Ray Serve (server/ray/app.py, server/ray/cli.py), without a cluster: the deployment
settings each way of starting it gives, the autoscaling policy, `serve run`'s typed arguments and `talkstream serve
--ray`'s wiring. tests/server/ray/test_ray_serve.py runs the same application on a local cluster."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine.config import EngineConfig
from server import cli
from server.ray import cli as cli_ray

# Ray Serve's own pydantic models use a keyword pydantic 2 deprecates (ray/serve/_private/config.py): not ours to fix
RAY_FIELD_WARNING = "ignore:Using extra keyword arguments on `Field`:DeprecationWarning"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using extra keyword arguments on `Field`", DeprecationWarning)
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'talkstream[ray]' (scripts/setup "
                                            "installs it)")
    from ray import serve

    from server.ray import app as ray_app

pytestmark = pytest.mark.filterwarnings(RAY_FIELD_WARNING)

MAX_BATCH = MAX_QUEUE = 4
LIMIT = MAX_BATCH + MAX_QUEUE


@pytest.fixture
def config(tiny_cache: Path, tiny_dir: Path) -> EngineConfig:
    return EngineConfig(model="tiny", device="cpu", cache_dir=tiny_cache, max_batch=MAX_BATCH, max_queue=MAX_QUEUE,
                        quantize="int8")


def test_settings_route_by_admission_limit_and_scale_on_streams(config: EngineConfig) -> None:
    fixed = ray_app.deployment_settings([config], ray_app.RayOptions(replicas=3, num_gpus=1))
    assert fixed["max_ongoing_requests"] == fixed["max_queued_requests"] == LIMIT
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"]["num_gpus"] == 1
    assert fixed["backpressure_config"] == {"status_code": 429, "retry_after_s": 1}
    scaled = ray_app.deployment_settings([config], ray_app.RayOptions(replicas=1, max_replicas=4))["autoscaling_config"]
    assert (scaled["min_replicas"], scaled["max_replicas"], scaled["target_ongoing_requests"]) == (1, 4, MAX_BATCH)
    assert scaled["policy"]["policy_function"] == "server.ray.app:streams_policy"


def test_the_policy_wants_a_replica_per_target_streams() -> None:
    def ctx(streams: dict[str, float] | None, target: float = 4.0) -> Any:
        config = SimpleNamespace(get_target_ongoing_requests=lambda: target)
        metrics = None if streams is None else {ray_app.STREAMS_METRIC: streams}
        return SimpleNamespace(aggregated_metrics=metrics, target_num_replicas=2, config=config)

    assert ray_app.streams_policy(ctx({"a": 10.0, "b": 7.0}))[0] == 5  # 17 streams, 4 a replica
    assert ray_app.streams_policy(ctx({"a": 0.0, "b": 0.0}))[0] == 1  # never below one (Ray applies the minimum)
    assert ray_app.streams_policy(ctx(None))[0] == 2  # no reports yet: as it is


def test_serve_run_arguments_are_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve run server.ray.app:build key=value ...` and KubeRay's `args` give strings; each becomes its type."""
    bound: dict[str, Any] = {}
    monkeypatch.setattr(ray_app, "build_app", lambda configs, options: bound.update(configs=configs, options=options))
    monkeypatch.setenv("TALKSTREAM_API_KEY", "k")
    ray_app.build({"model": "tiny", "max_batch": "3", "device": "cpu", "replicas": "2", "max_replicas": "5",
                   "num_gpus": "1", "cors_origins": "https://a.example, https://b.example", "log_input": "true"})
    [engine] = bound["configs"]
    assert (engine.model, engine.max_batch, engine.device) == ("tiny", 3, "cpu")
    options = bound["options"]
    assert (options.replicas, options.max_replicas, options.num_gpus, options.api_key) == (2, 5, 1.0, "k")
    assert options.cors_origins == ("https://a.example", "https://b.example") and options.log_input is True
    with pytest.raises(ValueError, match="unknown argument 'replica'"):
        ray_app.build({"replica": "2"})


def test_serve_ray_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """`talkstream serve --ray`'s wiring, without a second cluster: what reaches Ray and the applications."""
    made: dict[str, Any] = {}
    monkeypatch.setattr(ray, "init", lambda **kw: made.update(init=kw))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    monkeypatch.setattr(ray, "shutdown", lambda: made.update(shutdown=True))
    monkeypatch.setattr(serve, "start", lambda **kw: made.update(start=kw))
    monkeypatch.setattr(serve, "delete", lambda name: made.setdefault("deleted", []).append(name))
    monkeypatch.setattr(serve, "shutdown", lambda: made.update(serve_shutdown=True))
    monkeypatch.setattr(ray_app, "deploy", lambda configs, options: made.update(configs=configs, options=options))
    monkeypatch.setattr(cli_ray, "_wait_for_a_signal", lambda: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cli.main(["serve", "--ray", "--replicas", "2", "--max-replicas", "6", "--target-streams", "12",
                     "--max-batch", "16", "--port", "9001", "--api-key", "k",
                     "--cors-origins", "https://a.example"]) == 0
    assert made["init"] == {"include_dashboard": False} and made["start"]["http_options"]["port"] == 9001
    options = made["options"]
    assert (options.replicas, options.max_replicas, options.target_streams, options.api_key) == (2, 6, 12.0, "k")
    assert options.num_gpus == 1.0  # device auto on a cluster with GPUs: one each
    assert options.cors_origins == ("https://a.example",) and made["configs"][0].max_batch == 16
    assert made["deleted"] == [ray_app.APP_NAME, ray_app.REGISTRY_APP] and made["serve_shutdown"]
    made.clear()
    assert cli.main(["serve", "--ray", "--ray-address", "ray://head:10001", "--device", "cpu"]) == 0
    assert made["init"] == {"address": "ray://head:10001"} and "serve_shutdown" not in made  # not ours to stop
    assert made["options"].num_gpus == 0.0


def test_replicas_take_the_hosts_and_origins_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve run`: any Host unless listed (it binds the proxy where it chooses), TALKSTREAM_ALLOWED_* where the
    arguments give none; `talkstream serve --ray`: its --host decides, as without Ray."""
    bound: dict[str, Any] = {}
    monkeypatch.setattr(ray_app, "build_app", lambda configs, options: bound.update(options=options))
    monkeypatch.setenv("TALKSTREAM_ALLOWED_ORIGINS", "https://env.example")
    ray_app.build({"allowed_hosts": "a.example, b.example"})
    options = bound["options"]
    assert (options.bind_host, options.allowed_hosts) == ("0.0.0.0", ("a.example", "b.example"))
    assert options.allowed_origins == ("https://env.example",)
    args = cli.parser().parse_args(["serve", "--ray", "--allowed-hosts", "tts.example"])
    made = cli_ray.ray_options(args, [EngineConfig()], None, cluster_has_gpus=False)
    assert (made.bind_host, made.allowed_hosts, made.allowed_origins) == ("127.0.0.1", ("tts.example",),
                                                                          ("https://env.example",))

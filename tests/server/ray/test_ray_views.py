"""The application's views on Ray Serve (server/ray/views.py), without a cluster: the registry forgets a replica
that stopped reporting, the application answers while any replica is ready, and every replica's series keep their
own `replica` label in one exposition."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from server.ray.views import Reports, app_health, app_metrics

METRICS = """# HELP talkstream_requests_total Speech requests by protocol and outcome
# TYPE talkstream_requests_total counter
talkstream_requests_total{outcome="eos",protocol="http"} %d
# HELP talkstream_engine_ready 1 when the engine accepts requests
# TYPE talkstream_engine_ready gauge
talkstream_engine_ready %d
"""


def report(status: str, requests: int = 0) -> dict[str, Any]:
    return {"status": status, "pid": 1, "metrics": METRICS % (requests, status == "ready")}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_replica_that_stops_reporting_is_forgotten() -> None:
    clock = Clock()
    reports = Reports(stale_s=3.0, clock=clock)
    reports.put("a", report("ready"))
    clock.now = 2.0
    reports.put("b", report("ready"))
    assert reports.current()["a"]["age_s"] == 2.0 and set(reports.current()) == {"a", "b"}
    clock.now = 4.0  # a's last report is 4 s old: its process is gone, or it stopped without a word
    assert set(reports.current()) == {"b"}
    reports.drop("b")  # a replica's goodbye as it stops
    assert reports.current() == {}


def test_the_application_answers_while_any_replica_is_ready() -> None:
    assert app_health({"a": report("ready"), "b": report("ready")})[1]["status"] == "ready"
    status, body = app_health({"a": report("ready"), "b": report("dead")})
    assert (status, body["status"], body["ready_replicas"]) == (200, "degraded", 1)
    assert "metrics" not in body["replicas"]["a"]  # the health view leaves the metrics text out
    assert app_health({"b": report("dead")})[0] == 503
    assert app_health({}) == (503, {"status": "unavailable", "ready_replicas": 0, "replicas": {}})


def test_metrics_of_every_replica_in_one_exposition() -> None:
    text = app_metrics({"a": report("ready", 3), "b": report("dead", 5)}).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("talkstream_requests_total", (("outcome", "eos"), ("protocol", "http"), ("replica", "a")))] == 3
    assert samples[("talkstream_requests_total", (("outcome", "eos"), ("protocol", "http"), ("replica", "b")))] == 5
    assert samples[("talkstream_engine_ready", (("replica", "b"),))] == 0
    assert samples[("talkstream_replicas", (("state", "ready"),))] == 1
    assert samples[("talkstream_replicas", (("state", "dead"),))] == 1
    assert text.count("# TYPE talkstream_requests_total counter") == 1  # one family, not one per replica

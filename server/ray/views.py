"""What the whole Ray Serve application looks like from one place: every replica's health and metrics.

The proxy sends `/health` and `/metrics` to whichever replica it picks, so those stay each replica's own view (the
`x-talkstream-replica` header names it). Each replica also reports its view to the `Registry` deployment every
`report_period_s`; `/replicas/health` and `/replicas/metrics` answer from the registry, so any replica can give
the application's view. Nothing here imports Ray: the registry's bookkeeping and the merging of Prometheus texts
are plain Python, tested without a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from engine import EngineState
from server import errors

READY = EngineState.READY.value
STALE_PERIODS = 3  # reports missed before a replica is taken for gone (it stopped, or its process died)


@dataclass
class Reports:
    """The registry's state: each replica's last report and when it came."""

    stale_s: float
    clock: Any = time.monotonic
    _last: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)

    def put(self, replica: str, report: dict[str, Any]) -> None:
        self._last[replica] = (self.clock(), report)

    def drop(self, replica: str) -> None:
        self._last.pop(replica, None)

    def current(self) -> dict[str, dict[str, Any]]:
        """Reports not older than `stale_s`, each with its age; older ones are forgotten."""
        now = self.clock()
        for replica in [r for r, (t, _) in self._last.items() if now - t > self.stale_s]:
            del self._last[replica]
        return {r: {**report, "age_s": round(now - t, 3)} for r, (t, report) in sorted(self._last.items())}


def app_health(reports: dict[str, dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The application answers (200) while any replica is ready; `degraded` when some are not."""
    ready = sum(1 for r in reports.values() if r["status"] == READY)
    status = "ready" if reports and ready == len(reports) else "degraded" if ready else "unavailable"
    body = {"status": status, "ready_replicas": ready, "replicas": {
        replica: {k: v for k, v in report.items() if k != "metrics"} for replica, report in reports.items()}}
    return (200 if ready else errors.NOT_READY), body


def app_metrics(reports: dict[str, dict[str, Any]]) -> bytes:
    """Every replica's metrics in one exposition, each series labelled with its replica, plus the count of
    replicas in each state."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(reports))
    return generate_latest(registry)


class _Merged:
    def __init__(self, reports: dict[str, dict[str, Any]]) -> None:
        self.reports = reports

    def collect(self) -> Iterator[Metric]:
        states = Metric("talkstream_replicas", "Replicas reporting, by state", "gauge")
        for state in sorted({r["status"] for r in self.reports.values()} | {READY}):
            count = sum(1 for r in self.reports.values() if r["status"] == state)
            states.add_sample("talkstream_replicas", {"state": state}, count)
        yield states
        yield from merge_families((replica, r.get("metrics", "")) for replica, r in self.reports.items())


def merge_families(texts: Iterable[tuple[str, str]]) -> Iterator[Metric]:
    """Prometheus texts → one family per name, every sample labelled `replica`."""
    merged: dict[str, Metric] = {}
    for replica, text in texts:
        for family in text_string_to_metric_families(text):
            into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                         family.unit))
            into.samples.extend(Sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp, s.exemplar)
                                for s in family.samples)
    yield from merged.values()

"""Prometheus metrics, one registry per app. Engine gauges and step timings are read at scrape time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine import EngineState
from server.audio.encoders import open_encoder_count

if TYPE_CHECKING:
    from engine import Engine, StepTiming
    from server.voices.db import Quota, Usage

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0)
_GAP_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
_ENGINE_GAUGES = ("active_requests", "queued_requests", "slots_in_use", "codec_jobs_in_flight", "snapshot_backlog",
                  "codec_streams", "output_routes", "clone_jobs")

_LIBRARY_GAUGES = {"bytes": "Bytes of consent recordings and voice data in the voice library",
                   "voices": "Created voices, of every model", "consents": "Consent recordings",
                   "quota_bytes": "The voice library's byte quota", "max_voices": "The voice library's voice limit"}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttfa = Histogram("talkstream_time_to_first_audio_seconds", "Submit to first PCM chunk",
                              ["protocol"], buckets=_LATENCY_BUCKETS, registry=r)
        self.step_time = Histogram("talkstream_step_seconds", "Talker decode step (forward start to sample end)",
                                   buckets=_STEP_BUCKETS, registry=r)
        self.step_gap = Histogram("talkstream_step_gap_seconds", "Sample end of step N to forward start of N+1",
                                  buckets=_GAP_BUCKETS, registry=r)
        self.requests = Counter("talkstream_requests", "Speech requests by protocol and outcome",
                                ["protocol", "outcome"], registry=r)
        self.audio_seconds = Counter("talkstream_audio_seconds", "Seconds of audio produced", ["protocol"],
                                     registry=r)
        self.errors = Counter("talkstream_errors", "Error responses and events by type and code",
                              ["type", "code"], registry=r)
        self.engine = {name: Gauge(f"talkstream_{name}", name.replace("_", " "), registry=r)
                       for name in _ENGINE_GAUGES}
        self.open_encoders = Gauge("talkstream_open_encoders", "Format encoders not yet closed", registry=r)
        self.open_responses = Gauge("talkstream_open_responses", "Responses whose handler holds an engine stream",
                                    ["protocol"], registry=r)
        self.sessions = Gauge("talkstream_realtime_sessions", "Open Realtime WebSocket sessions", registry=r)
        for protocol in ("http", "ws"):
            self.open_responses.labels(protocol).set(0)
        self.ready = Gauge("talkstream_engine_ready", "1 when the engine accepts requests", registry=r)
        self.library_gauges = {name: Gauge(f"talkstream_voice_library_{name}", text, registry=r)
                               for name, text in _LIBRARY_GAUGES.items()}
        self._last_step: dict[int, int] = {}  # per engine

    def error(self, type_: str, code: str | None) -> None:
        self.errors.labels(type_, code or "").inc()

    def first_audio(self, protocol: str, seconds: float | None) -> None:
        if seconds is not None:
            self.ttfa.labels(protocol).observe(seconds)

    def finished(self, protocol: str, outcome: str, audio_seconds: float) -> None:
        self.requests.labels(protocol, outcome).inc()
        self.audio_seconds.labels(protocol).inc(audio_seconds)

    def library(self, usage: Usage, quota: Quota) -> None:
        """What the voice library holds, and its quota (server/voices/db.py)."""
        values = {"bytes": usage.bytes, "voices": usage.voices, "consents": usage.consents,
                  "quota_bytes": quota.max_bytes, "max_voices": quota.max_voices}
        for name, value in values.items():
            self.library_gauges[name].set(value)

    def scrape(self, engines: list[Engine]) -> bytes:
        self._refresh(engines)
        return generate_latest(self.registry)

    def _refresh(self, engines: list[Engine]) -> None:
        """Engine gauges summed over the served models; ready when all are; each model's steps observed."""
        totals = dict.fromkeys(self.engine, 0)
        for engine in engines:
            for name, value in engine.stats().items():
                if name in totals:
                    totals[name] += value
            if engine.worker is not None:
                self._ingest(id(engine), engine.worker.timings.snapshot())
        for name, value in totals.items():
            self.engine[name].set(value)
        self.open_encoders.set(open_encoder_count())
        self.ready.set(1 if all(e.state is EngineState.READY for e in engines) else 0)

    def _ingest(self, key: int, timings: list[StepTiming]) -> None:
        """Observes steps not seen at earlier scrapes (the ring keeps the last few thousand)."""
        last = self._last_step.get(key, -1)
        prev: StepTiming | None = None
        for t in timings:
            if t.step > last:
                if t.forward_start and t.sample_end:
                    self.step_time.observe(t.sample_end - t.forward_start)
                if prev is not None and t.contiguous and t.step == prev.step + 1 and prev.sample_end:
                    self.step_gap.observe(max(0.0, t.forward_start - prev.sample_end))
            prev = t
        if timings:
            self._last_step[key] = max(last, timings[-1].step)

"""Leak counts as `/metrics` shows them, and waiting for them to return to zero."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

LEAK_GAUGES = ("talkstream_active_requests", "talkstream_slots_in_use", "talkstream_queued_requests",
               "talkstream_codec_jobs_in_flight", "talkstream_codec_streams", "talkstream_output_routes",
               "talkstream_clone_jobs", "talkstream_open_encoders",
               'talkstream_open_responses{protocol="http"}', 'talkstream_open_responses{protocol="ws"}')


def scrape(url: str) -> dict[str, float]:
    """Sample name (with labels as Prometheus writes them) → value."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def leak_counts(url: str) -> dict[str, float]:
    metrics = scrape(url)
    return {name: metrics[name] for name in LEAK_GAUGES}


def wait_no_leaks(url: str, timeout: float = 5.0) -> dict[str, float]:
    """Waits until every leak count is zero; returns the counts that are not (empty when nothing leaked)."""
    deadline = time.monotonic() + timeout
    while True:
        counts = {name: value for name, value in leak_counts(url).items() if value}
        if not counts or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)

"""The per-request metric series expose exactly what prometheus_client's own types expose (less ``_created``)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.observability.metrics import Metrics
from gateway.observability.series import LabelledCounter, LabelledHistogram

BUCKETS = (0.00001, 0.001, 0.0025, 0.01, 1, 2.5, 60)


def _lines(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_the_exposition_is_prometheus_clients() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("x_seconds", "doc", ["route"], buckets=BUCKETS, registry=theirs)
    c1 = Counter("x_requests", "doc", ["route", "status"], registry=theirs)
    h2, c2 = (
        LabelledHistogram("x_seconds", "doc", ["route"], BUCKETS),
        LabelledCounter("x_requests", "doc", ["route", "status"]),
    )
    ours.register(h2)
    ours.register(c2)
    assert _lines(theirs) == _lines(ours)  # families with no series yet: their HELP and TYPE lines
    # on a bound, just above one, below the first, past the last, and a route seen once
    for route, value in [("chat", 0.001), ("chat", 0.0010001), ("chat", 0.0), ("chat", 99.0), ("emb", 2.5)]:
        h1.labels(route).observe(value)
        h2.labels(route).observe(value)
        c1.labels(route, "200").inc()
        c2.labels(route, "200").inc()
    c1.labels("chat", "502").inc(3)
    c2.labels("chat", "502").inc(3)
    assert _lines(theirs) == _lines(ours)


def test_wrong_labels_and_buckets_are_refused() -> None:
    with pytest.raises(ValueError, match="labels"):
        LabelledHistogram("h", "doc", ["route"], BUCKETS).labels("a", "b")
    with pytest.raises(ValueError, match="labels"):
        LabelledCounter("c", "doc", ["a", "b"]).labels("a")
    for buckets in [(), (1.0, 1.0), (1.0, float("inf"))]:
        with pytest.raises(ValueError, match="buckets"):
            LabelledHistogram("h", "doc", ["route"], buckets)


def test_the_gateways_request_figures_reach_its_scrape() -> None:
    metrics = Metrics()
    metrics.request("chat", 200, "w0", 0.02)
    metrics.ttfb("chat", 0.004)
    metrics.stage("policy", 0.00002)
    text = metrics.render().decode()
    assert 'kvgate_requests_total{route="chat",status="200",worker="w0"} 1.0' in text
    assert 'kvgate_request_duration_seconds_bucket{le="0.025",route="chat"} 1.0' in text
    assert 'kvgate_ttfb_seconds_count{route="chat"} 1.0' in text
    assert 'kvgate_stage_seconds_bucket{le="2.5e-05",stage="policy"} 1.0' in text

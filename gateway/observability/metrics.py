"""``kvgate_*`` Prometheus metrics on an app-owned ``CollectorRegistry`` (never the global one).
Compiled with mypyc (``docs/development.md``: what that rules out).

Per-request updates go through small caches of labelled children so the hot path does a dict lookup and
an increment. Gauges that mirror the fleet (in flight, health, breaker, queue) are read at scrape time by
a collector, so they cost nothing per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.fleet.breaker import BreakerState
from gateway.fleet.registry import Fleet
from gateway.observability.series import LabelledCounter, LabelledHistogram
from gateway.state.lag import LagRecorder
from gateway.state.protocols import LoadBoard
from kvgate_core.spans import stage_span

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_STAGE_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)
_BREAKER_VALUE = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 1.0, BreakerState.OPEN: 2.0}


class FleetCollector(Collector):
    """Scrape-time gauges of every worker: in flight, healthy, breaker state, queue, KV usage."""

    def __init__(self, fleet: Fleet, load: LoadBoard, degraded: Callable[[], bool]) -> None:
        self._fleet = fleet
        self._load = load
        self._degraded = degraded

    def collect(self) -> Iterator[Metric]:
        inflight = GaugeMetricFamily(
            "kvgate_worker_inflight_requests", "Requests in flight", labels=["worker"]
        )
        healthy = GaugeMetricFamily("kvgate_worker_healthy", "1 when health probes pass", labels=["worker"])
        breaker = GaugeMetricFamily(
            "kvgate_worker_breaker_state", "0 closed, 1 half-open, 2 open", labels=["worker"]
        )
        queue = GaugeMetricFamily(
            "kvgate_worker_queue_depth", "Requests waiting (worker /load)", labels=["worker"]
        )
        kv = GaugeMetricFamily(
            "kvgate_worker_kv_usage_ratio", "KV cache use (worker /load)", labels=["worker"]
        )
        mode = GaugeMetricFamily(
            "kvgate_worker_index_mode",
            "1 for the KV index mode the worker's prefix hits come from (precise: its events; approximate: "
            "learned from routing; none)",
            labels=["worker", "mode"],
        )
        for r in self._fleet:
            mode.add_metric([r.id, r.facts.index_mode], 1.0)
            inflight.add_metric([r.id], self._load.get(r.id).inflight_requests)
            healthy.add_metric([r.id], 1.0 if r.healthy else 0.0)
            breaker.add_metric([r.id], _BREAKER_VALUE[r.breaker.state])
            queue.add_metric([r.id], r.queue_depth)
            kv.add_metric([r.id], r.kv_usage)
        degraded = GaugeMetricFamily(
            "kvgate_state_degraded", "1 while the shared state (Redis) is unreachable"
        )
        degraded.add_metric([], 1.0 if self._degraded() else 0.0)
        yield from (inflight, healthy, breaker, queue, kv, mode, degraded)


class IndexCollector(Collector):
    """Scrape-time size of the KV index (entries, and an estimate of the memory they hold)."""

    def __init__(self, num_blocks: Callable[[], int], bytes_per_block: int) -> None:
        self._num_blocks = num_blocks
        self._bytes_per_block = bytes_per_block

    def collect(self) -> Iterator[Metric]:
        n = self._num_blocks()
        blocks = GaugeMetricFamily("kvgate_kv_index_blocks", "Block entries held by the KV index")
        blocks.add_metric([], n)
        mem = GaugeMetricFamily("kvgate_kv_index_memory_bytes", "Estimated memory of the KV index entries")
        mem.add_metric([], n * self._bytes_per_block)
        yield from (blocks, mem)


class ReplicaLagCollector(Collector):
    """Scrape-time histogram of how late this replica saw what the replicas share, per kind (``load``: the
    other replicas' load board figures; ``prediction``: their routing predictions; ``kv_events``: worker
    events from the replica relaying them), from ``gateway.state.lag``."""

    def __init__(self, sources: Mapping[str, LagRecorder]) -> None:
        self._sources = dict(sources)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "kvgate_replica_lag_seconds",
            "Age of what gateway replicas share when this replica took it in: the oldest change of each "
            "push or batch received (kind: load figures, routing predictions, relayed KV events)",
            labels=["kind"],
        )
        for kind, recorder in self._sources.items():
            buckets = [(_bound(bound), float(n)) for bound, n in recorder.cumulative()]
            family.add_metric([kind], buckets, recorder.sum)
        yield family


def _bound(seconds: float) -> str:
    return "+Inf" if seconds == float("inf") else repr(seconds)


class Metrics:
    """The gateway's metrics; one instance per app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # updated on every request: the cheap series (``gateway.observability.series``)
        self._requests = LabelledCounter(
            "kvgate_requests", "Requests answered", ["route", "status", "worker"]
        )
        self._ttfb = LabelledHistogram(
            "kvgate_ttfb_seconds", "Time to first upstream byte", ["route"], _LATENCY_BUCKETS
        )
        self._latency = LabelledHistogram(
            "kvgate_request_duration_seconds", "Request duration", ["route"], _LATENCY_BUCKETS
        )
        self._stage = LabelledHistogram(
            "kvgate_stage_seconds", "Time per request stage", ["stage"], _STAGE_BUCKETS
        )
        for family in (self._requests, self._ttfb, self._latency, self._stage):
            self.registry.register(family)
        self._loop_lag = Histogram(
            "kvgate_event_loop_lag_seconds",
            "How late a 100 ms timer fired on the gateway's event loop (time the loop was busy)",
            buckets=_LAG_BUCKETS,
            registry=self.registry,
        )
        self._retries = Counter(
            "kvgate_retries", "Attempts retried on another worker", ["reason"], registry=self.registry
        )
        self._shed = Counter(
            "kvgate_upstream_shed",
            "Requests not forwarded to a worker: its upstream connection cap and wait queue were full "
            "(queue_full: tried on another worker, else 503) or the wait for a connection ran out "
            "(wait_timeout: 503)",
            ["worker", "reason"],
            registry=self.registry,
        )
        self._cache: dict[tuple[str, ...], Counter | Histogram] = {}

    def attach_fleet(
        self, fleet: Fleet, load: LoadBoard, degraded: Callable[[], bool] = lambda: False
    ) -> None:
        """Expose the fleet's gauges, read at scrape time; ``degraded``: is the shared state down?"""
        self.registry.register(FleetCollector(fleet, load, degraded))

    def attach_index(self, num_blocks: Callable[[], int], bytes_per_block: int = 120) -> None:
        """Expose the KV index's size (``bytes_per_block``: measured cost of one entry)."""
        self.registry.register(IndexCollector(num_blocks, bytes_per_block))

    def attach_replica_lag(self, sources: Mapping[str, LagRecorder]) -> None:
        """Expose how late this replica sees the others' changes; with no ``sources`` (memory state) the
        family is declared without samples, so dashboards and alerts name a metric every gateway exports."""
        self.registry.register(ReplicaLagCollector(sources))

    def _child(self, family: Counter | Histogram, *labels: str) -> Counter | Histogram:
        key = (family._name, *labels)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = family.labels(*labels)
        return child

    def request(self, route: str, status: int, worker: str, latency_s: float) -> None:
        self._requests.labels(route, str(status), worker).inc()
        self._latency.labels(route).observe(latency_s)

    def ttfb(self, route: str, seconds: float) -> None:
        self._ttfb.labels(route).observe(seconds)

    def stage(self, stage: str, seconds: float) -> None:
        self._stage.labels(stage).observe(seconds)
        stage_span(stage, seconds)

    def loop_lag(self, seconds: float) -> None:
        self._loop_lag.observe(seconds)

    def retry(self, reason: str) -> None:
        self._child(self._retries, reason).inc()  # type: ignore[union-attr]

    def upstream_shed(self, worker: str, reason: str) -> None:
        """Count a request shed before forwarding (``reason``: queue_full | wait_timeout)."""
        self._child(self._shed, worker, reason).inc()  # type: ignore[union-attr]

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""What a load tool reads about a process it started: RSS and open fds from ``/proc``, the open-files limit,
and the gateway's event-loop lag from the ``kvgate_event_loop_lag_seconds`` histogram on ``/metrics``.

The histogram is cumulative; ``lag_between`` turns two scrapes into the lag of the wake-ups in between
(mean, and p99 / max as the upper bound of the bucket they fall in).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

LAG_METRIC = "kvgate_event_loop_lag_seconds"


@dataclass(frozen=True, slots=True)
class ProcSample:
    """A process's resident memory (bytes) and open file descriptors at one moment."""

    rss_bytes: int
    fds: int


def sample(pid: int) -> ProcSample | None:
    """RSS (``VmRSS`` of ``/proc/PID/status``) and the number of entries in ``/proc/PID/fd``; None if gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return ProcSample(rss_bytes=int(line.split()[1]) * 1024, fds=fds)
    return None  # a zombie has no VmRSS


def raise_nofile_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (children inherit it); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, 1 << 20) if hard == resource.RLIM_INFINITY else hard
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass(frozen=True, slots=True)
class Histogram:
    """One scrape of a Prometheus histogram: cumulative ``(le, count)`` buckets, sum and count."""

    buckets: tuple[tuple[float, float], ...] = ()
    total_s: float = 0.0
    count: float = 0.0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0–1), linearly interpolated inside its bucket as Prometheus's
        ``histogram_quantile`` does (above the last finite bound: that bound); nan without observations."""
        if not self.buckets or self.buckets[-1][1] <= 0:
            return math.nan
        rank = q * self.buckets[-1][1]
        lower = below = 0.0
        for bound, count in self.buckets:
            if count >= rank:
                if bound == math.inf:
                    return lower
                return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
            lower, below = bound, count
        return lower


def parse_histogram(text: str, name: str = LAG_METRIC, labels: Mapping[str, str] | None = None) -> Histogram:
    """The histogram ``name`` from Prometheus text exposition, its series carrying ``labels`` summed (every
    series when None); empty if absent."""
    want = dict(labels or {})
    buckets: defaultdict[float, float] = defaultdict(float)
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            if any(s.labels.get(k) != v for k, v in want.items()):
                continue
            if s.name == f"{name}_bucket":
                buckets[float(s.labels["le"])] += s.value
            elif s.name == f"{name}_sum":
                total += s.value
            elif s.name == f"{name}_count":
                count += s.value
    return Histogram(tuple(sorted(buckets.items())), total, count)


def merged(histograms: Iterable[Histogram]) -> Histogram:
    """Scrapes of several processes as one histogram: counts per bound, sums and counts added."""
    buckets: defaultdict[float, float] = defaultdict(float)
    total = count = 0.0
    for h in histograms:
        for bound, n in h.buckets:
            buckets[bound] += n
        total += h.total_s
        count += h.count
    return Histogram(tuple(sorted(buckets.items())), total, count)


@dataclass(frozen=True, slots=True)
class LagStats:
    """Event-loop lag between two scrapes; p99 and max are bucket upper bounds (seconds)."""

    wakeups: int
    mean_s: float
    p99_s: float
    max_s: float


def lag_between(before: Histogram, after: Histogram) -> LagStats:
    """The lag of the wake-ups observed between two scrapes of the same histogram."""
    n = after.count - before.count
    if n <= 0:
        return LagStats(0, 0.0, 0.0, 0.0)
    prev = dict(before.buckets)
    delta = [(le, cum - prev.get(le, 0.0)) for le, cum in after.buckets]
    p99 = next((le for le, cum in delta if cum >= 0.99 * n), math.inf)
    top = next((le for le, cum in delta if cum >= n), math.inf)
    return LagStats(int(n), (after.total_s - before.total_s) / n, p99, top)


def growth_pct(base: float, last: float) -> float:
    """``last`` relative to ``base`` in percent (0 when both are 0)."""
    if base == 0:
        return 0.0 if last == 0 else math.inf
    return (last - base) * 100.0 / base

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
from dataclasses import dataclass
from pathlib import Path

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


def parse_histogram(text: str, name: str = LAG_METRIC) -> Histogram:
    """The unlabelled histogram ``name`` from Prometheus text exposition (empty if absent)."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        key, _, value = line.rpartition(" ")
        if key.startswith(f'{name}_bucket{{le="'):
            le = key[len(name) + 12 : -2]
            buckets.append((math.inf if le == "+Inf" else float(le), float(value)))
        elif key == f"{name}_sum":
            total = float(value)
        elif key == f"{name}_count":
            count = float(value)
    return Histogram(tuple(sorted(buckets)), total, count)


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

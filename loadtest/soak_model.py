"""The soak's plain data: its restart schedule, the per-interval rows, the summary and how they print.

No I/O here (``loadtest.soak`` runs the fleet), so the schedule, the counting and the growth arithmetic are
unit-tested on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from loadtest.outcomes import Outcome
from loadtest.proc_stats import LagStats, growth_pct

#: the long soak's periods (issue 22): one worker every 2 minutes, Redis every 5 minutes
WORKER_EVERY_S = 120.0
REDIS_EVERY_S = 300.0


@dataclass(frozen=True, slots=True)
class Restart:
    """One scheduled restart: ``at_s`` seconds into the run, of worker ``index`` or of Redis."""

    at_s: float
    what: Literal["worker", "redis"]
    index: int = 0


def default_periods(duration_s: float) -> tuple[float, float]:
    """Worker and Redis restart periods: 2 and 5 minutes, compressed for short runs so that a run holds at
    least two worker restarts and one Redis restart (a third and half of the run)."""
    return min(WORKER_EVERY_S, duration_s / 3), min(REDIS_EVERY_S, duration_s / 2)


def restart_schedule(
    duration_s: float, worker_every_s: float, redis_every_s: float, workers: int, quiet_tail_s: float
) -> list[Restart]:
    """Restarts every period, workers in turn, none in the last ``quiet_tail_s`` (so the run can show that
    it recovered); sorted by time, a worker before Redis at the same moment."""
    last = duration_s - quiet_tail_s
    events: list[Restart] = []
    if worker_every_s > 0 and workers > 0:
        n = int(last // worker_every_s)
        events += [Restart(k * worker_every_s, "worker", (k - 1) % workers) for k in range(1, n + 1)]
    if redis_every_s > 0:
        n = int(last // redis_every_s)
        events += [Restart(k * redis_every_s, "redis") for k in range(1, n + 1)]
    return sorted(events, key=lambda e: (e.at_s, e.what != "worker"))


@dataclass(slots=True)
class Counts:
    """How requests ended: ok, shed (503 + Retry-After), failed, cut (stream ended by an error event)."""

    ok: int = 0
    shed: int = 0
    failed: int = 0
    cut: int = 0

    def add(self, outcome: Outcome) -> None:
        setattr(self, outcome.kind.value, getattr(self, outcome.kind.value) + 1)

    @property
    def total(self) -> int:
        return self.ok + self.shed + self.failed + self.cut


@dataclass(frozen=True, slots=True)
class IntervalRow:
    """One printed interval: gateway RSS at its end, the range of open fds sampled in it, event-loop lag,
    how the requests that ended in it ended, and the restarts done in it."""

    end_s: float
    rss_bytes: int
    fds_min: int
    fds_max: int
    lag: LagStats
    counts: Counts
    events: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SoakResult:
    """The whole soak. Growth compares the last interval with the first one (the warm-up): RSS at the
    interval's end, fds at their minimum in the interval (the fewest requests in flight).

    ``lost``: accepted requests that neither completed, nor were shed, nor were streams cut with an error
    event, i.e. every failure (the gateway itself stays up, so a refused connection is a loss too).
    """

    rows: tuple[IntervalRow, ...]
    totals: Counts
    rss_growth_pct: float
    fds_growth_pct: float
    fds_growth: int
    restarts: tuple[str, ...] = ()
    failures: tuple[str, ...] = field(default=())

    @property
    def lost(self) -> int:
        return self.totals.failed


def summarize(
    rows: list[IntervalRow], totals: Counts, restarts: list[str], failures: list[str]
) -> SoakResult:
    """Growth after warm-up (first interval excluded) and the totals; no rows: no growth."""
    if not rows:
        return SoakResult((), totals, 0.0, 0.0, 0, tuple(restarts), tuple(failures))
    base, last = rows[0], rows[-1]
    return SoakResult(
        rows=tuple(rows),
        totals=totals,
        rss_growth_pct=growth_pct(base.rss_bytes, last.rss_bytes),
        fds_growth_pct=growth_pct(base.fds_min, last.fds_min),
        fds_growth=last.fds_min - base.fds_min,
        restarts=tuple(restarts),
        failures=tuple(failures),
    )


HEADER = (
    "| t (s) | RSS MiB | open fds (min-max) | loop lag mean / p99 / max ms "
    "| ok | shed | failed | cut | restarts |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def _ms(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value * 1e3:.1f}"


def format_row(row: IntervalRow) -> str:
    """One markdown table row."""
    lag = f"{_ms(row.lag.mean_s)} / ≤{_ms(row.lag.p99_s)} / ≤{_ms(row.lag.max_s)}"
    c = row.counts
    return (
        f"| {row.end_s:.0f} | {row.rss_bytes / 2**20:.1f} | {row.fds_min}-{row.fds_max} | {lag} | "
        f"{c.ok} | {c.shed} | {c.failed} | {c.cut} | {', '.join(row.events) or '-'} |"
    )


def format_summary(result: SoakResult) -> str:
    """The closing lines: totals, growth after warm-up, lost requests and the first failures."""
    t = result.totals
    lines = [
        f"requests: {t.total} (ok {t.ok}, shed {t.shed}, failed {t.failed}, streams cut with an error event "
        f"{t.cut}); restarts: {len(result.restarts)}",
        f"growth after warm-up (first interval excluded): RSS {result.rss_growth_pct:+.1f}%, open fds "
        f"{result.fds_growth:+d} ({result.fds_growth_pct:+.1f}%)",
        f"requests lost: {result.lost}",
    ]
    lines += [f"  failure: {f}" for f in result.failures[:10]]
    return "\n".join(lines)

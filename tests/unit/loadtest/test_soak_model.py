"""The soak's schedule, counting and growth arithmetic (no processes)."""

from __future__ import annotations

import pytest

from loadtest.outcomes import Kind, Outcome
from loadtest.proc_stats import LagStats
from loadtest.soak_model import (
    Counts,
    IntervalRow,
    Restart,
    default_periods,
    format_row,
    format_summary,
    restart_schedule,
    summarize,
)

NO_LAG = LagStats(10, 0.001, 0.0025, 0.005)


def test_a_long_run_restarts_a_worker_every_2_minutes_and_redis_every_5() -> None:
    worker_s, redis_s = default_periods(1800)
    events = restart_schedule(1800, worker_s, redis_s, workers=3, quiet_tail_s=10)
    workers = [e for e in events if e.what == "worker"]
    assert [e.at_s for e in workers] == [120.0 * k for k in range(1, 15)]
    assert [e.index for e in workers[:4]] == [0, 1, 2, 0]
    assert [e.at_s for e in events if e.what == "redis"] == [300.0, 600.0, 900.0, 1200.0, 1500.0]


def test_a_one_minute_run_still_restarts_two_workers_and_redis() -> None:
    worker_s, redis_s = default_periods(60)
    assert restart_schedule(60, worker_s, redis_s, workers=3, quiet_tail_s=9) == [
        Restart(20.0, "worker", 0),
        Restart(30.0, "redis"),
        Restart(40.0, "worker", 1),
    ]


def test_the_quiet_tail_and_a_zero_period_leave_restarts_out() -> None:
    assert restart_schedule(100, 50, 0, workers=2, quiet_tail_s=10) == [Restart(50.0, "worker", 0)]
    assert restart_schedule(100, 0, 0, workers=2, quiet_tail_s=10) == []


def test_a_worker_goes_before_redis_at_the_same_moment() -> None:
    assert [e.what for e in restart_schedule(610, 300, 300, 2, 5)] == ["worker", "redis", "worker", "redis"]


def test_counts_add_outcomes_by_kind() -> None:
    counts = Counts()
    for kind in (Kind.OK, Kind.OK, Kind.SHED, Kind.FAILED, Kind.CUT):
        counts.add(Outcome(kind))
    assert (counts.ok, counts.shed, counts.failed, counts.cut, counts.total) == (2, 1, 1, 1, 5)


def _row(end_s: float, rss_mib: float, fds_min: int, failed: int = 0) -> IntervalRow:
    return IntervalRow(
        end_s, int(rss_mib * 2**20), fds_min, fds_min + 5, NO_LAG, Counts(ok=10, failed=failed)
    )


def test_growth_compares_the_last_interval_with_the_warm_up_one() -> None:
    rows = [_row(60, 100, 50), _row(120, 130, 40), _row(180, 110, 55)]
    result = summarize(rows, Counts(ok=30), ["worker 0 at 60s"], [])
    assert result.rss_growth_pct == pytest.approx(10.0)
    assert result.fds_growth == 5
    assert result.fds_growth_pct == pytest.approx(10.0)
    assert result.lost == 0


def test_every_failure_is_a_lost_request_but_cuts_and_sheds_are_not() -> None:
    result = summarize([_row(60, 100, 50)], Counts(ok=5, shed=2, cut=3, failed=1), [], ["1.0s: HTTP 502"])
    assert result.lost == 1
    assert (result.rss_growth_pct, result.fds_growth) == (0.0, 0)
    assert "requests lost: 1" in format_summary(result)
    assert "HTTP 502" in format_summary(result)


def test_no_rows_no_growth() -> None:
    assert summarize([], Counts(), [], []).rss_growth_pct == 0.0


def test_a_row_prints_its_figures() -> None:
    line = format_row(_row(60, 100, 50, failed=2))
    assert line.startswith("| 60 | 100.0 | 50-55 | 1.0 / ≤2.5 / ≤5.0 | 10 | 0 | 2 | 0 | - |")

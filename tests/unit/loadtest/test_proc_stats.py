"""Reading a process's RSS and fds, the open-files limit, and event-loop lag from two metric scrapes."""

from __future__ import annotations

import math
import os
import resource

import pytest

from loadtest.proc_stats import (
    Histogram,
    growth_pct,
    lag_between,
    parse_histogram,
    raise_nofile_limit,
    sample,
)


def _exposition(counts: list[float], total: float) -> str:
    les = ["0.001", "0.01", "0.1", "+Inf"]
    lines = ["# HELP kvgate_event_loop_lag_seconds lag", "# TYPE kvgate_event_loop_lag_seconds histogram"]
    lines += [
        f'kvgate_event_loop_lag_seconds_bucket{{le="{le}"}} {c}' for le, c in zip(les, counts, strict=True)
    ]
    lines += [
        f"kvgate_event_loop_lag_seconds_count {counts[-1]}",
        f"kvgate_event_loop_lag_seconds_sum {total}",
    ]
    lines += ["kvgate_event_loop_lag_seconds_created 1.7e+09", 'other_metric_bucket{le="1"} 9.0']
    return "\n".join(lines) + "\n"


def test_parse_histogram_reads_buckets_sum_and_count() -> None:
    h = parse_histogram(_exposition([1, 3, 4, 4], 0.05))
    assert h.buckets == ((0.001, 1.0), (0.01, 3.0), (0.1, 4.0), (math.inf, 4.0))
    assert (h.count, h.total_s) == (4.0, 0.05)


def test_parse_histogram_of_a_page_without_it_is_empty() -> None:
    assert parse_histogram("up 1\n") == Histogram()


def test_lag_between_two_scrapes_counts_only_the_wakeups_in_between() -> None:
    before = parse_histogram(_exposition([10, 10, 10, 10], 0.001))
    after = parse_histogram(_exposition([10, 110, 110, 111], 0.501))  # 100 under 10 ms, one over 100 ms
    lag = lag_between(before, after)
    assert lag.wakeups == 101
    assert lag.mean_s == pytest.approx(0.5 / 101)
    assert lag.p99_s == 0.01
    assert lag.max_s == math.inf


def test_lag_without_new_wakeups_is_zero() -> None:
    h = parse_histogram(_exposition([1, 1, 1, 1], 0.0))
    assert lag_between(h, h).wakeups == 0


@pytest.mark.parametrize(
    ("base", "last", "pct"), [(100, 110, 10.0), (100, 90, -10.0), (0, 0, 0.0), (0, 3, math.inf)]
)
def test_growth_pct(base: float, last: float, pct: float) -> None:
    assert growth_pct(base, last) == pct


def test_sample_reads_this_process_and_none_for_a_gone_one() -> None:
    s = sample(os.getpid())
    assert s is not None
    assert s.rss_bytes > 1 << 20
    assert s.fds >= 3
    assert sample(2**22 + 12345) is None


def test_raise_nofile_limit_reaches_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        assert raise_nofile_limit() == (hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

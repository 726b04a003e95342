"""The admin page's per-worker window: requests/s, TTFT p50, failures, predicted against reported hits."""

from __future__ import annotations

import pytest

from gateway.observability.worker_stats import WorkerStats, WorkerWindow


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_rate_median_and_failures_over_the_window() -> None:
    clock = Clock()
    stats = WorkerStats(window_s=10.0, clock=clock)
    clock.now += 20.0  # the gateway has run longer than the window
    for ttft in (0.3, 0.1, 0.2):
        stats.record("a", True, ttft)
    stats.record("a", False, None)
    win = stats.summaries(["a", "b"])
    assert win["a"].requests == 4 and win["a"].errors == 1
    assert win["a"].requests_per_s == pytest.approx(0.4)
    assert win["a"].ttft_p50_s == 0.2
    assert win["b"] == WorkerWindow()


def test_samples_older_than_the_window_no_longer_count() -> None:
    clock = Clock()
    stats = WorkerStats(window_s=10.0, clock=clock)
    stats.record("a", True, 5.0)
    clock.now += 11.0
    stats.record("a", True, 0.5)
    win = stats.summaries(["a"])["a"]
    assert (win.requests, win.ttft_p50_s) == (1, 0.5)
    clock.now += 11.0
    assert stats.summaries(["a"])["a"] == WorkerWindow()


def test_a_young_gateway_divides_by_its_age_and_a_full_ring_by_its_span() -> None:
    clock = Clock()
    stats = WorkerStats(window_s=30.0, max_samples=4, clock=clock)
    clock.now += 2.0
    stats.record("a", True, 0.1)
    assert stats.summaries(["a"])["a"].requests_per_s == pytest.approx(0.5)  # 1 in 2 s, not 1 in 30 s
    for _ in range(4):
        clock.now += 0.5
        stats.record("a", True, 0.1)
    win = stats.summaries(["a"])["a"]
    assert win.requests == 4  # at most max_samples are kept
    assert win.requests_per_s == pytest.approx(4 / 1.5)  # the kept samples' own span


def test_hit_ratios_count_only_reported_requests_with_a_prompt() -> None:
    stats = WorkerStats(clock=Clock())
    stats.record("a", True, 0.1, prompt_tokens=100, predicted_tokens=80, reported_tokens=40)
    stats.record("a", True, 0.1, prompt_tokens=100, predicted_tokens=0, reported_tokens=50)
    stats.record("a", True, 0.1, prompt_tokens=100, predicted_tokens=90, reported_tokens=None)  # no report
    stats.record("a", True, 0.1, prompt_tokens=0, predicted_tokens=0, reported_tokens=7)  # no prediction made
    stats.record("a", False, None, prompt_tokens=100, predicted_tokens=100, reported_tokens=100)  # failed
    win = stats.summaries(["a"])["a"]
    assert win.predicted_hit == pytest.approx(80 / 200)
    assert win.reported_hit == pytest.approx(90 / 200)
    assert win.realised == pytest.approx(40 / 80)
    assert win.checked == 1


def test_no_report_leaves_the_hit_figures_unknown() -> None:
    stats = WorkerStats(clock=Clock())
    stats.record("a", True, 0.1, prompt_tokens=100, predicted_tokens=80)
    win = stats.summaries(["a"])["a"]
    assert (win.predicted_hit, win.reported_hit, win.realised, win.checked) == (None, None, None, 0)


def test_workers_that_left_are_forgotten() -> None:
    stats = WorkerStats(clock=Clock())
    stats.record("a", True, 0.1)
    stats.record("gone", True, 0.1)
    assert set(stats.summaries(["a"])) == {"a"}
    assert stats.summaries(["a", "gone"])["gone"] == WorkerWindow()


@pytest.mark.parametrize(("window_s", "max_samples"), [(0.0, 8), (5.0, 0)])
def test_limits_must_be_positive(window_s: float, max_samples: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        WorkerStats(window_s=window_s, max_samples=max_samples)

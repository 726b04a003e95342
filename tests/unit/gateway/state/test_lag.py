"""The replica-lag recorder: buckets, sum and count."""

from __future__ import annotations

from gateway.state.lag import LAG_BUCKETS, LagRecorder


def test_observations_fall_in_the_first_bucket_that_holds_them() -> None:
    lag = LagRecorder()
    for seconds in (0.0004, 0.0005, 0.004, 0.012, 7.0, -0.2):  # negative: the sender's clock ran ahead
        lag.observe(seconds)
    cumulative = dict(lag.cumulative())
    assert cumulative[0.0005] == 3  # 0.4 ms, 0.5 ms (a bound holds its own value) and the clamped -0.2
    assert cumulative[0.005] == 4
    assert cumulative[0.015] == 5
    assert cumulative[LAG_BUCKETS[-1]] == 5
    assert cumulative[float("inf")] == lag.count == 6
    assert lag.sum == 0.0004 + 0.0005 + 0.004 + 0.012 + 7.0


def test_cumulative_counts_never_fall_and_cover_every_bound() -> None:
    lag = LagRecorder()
    for i in range(200):
        lag.observe(i * 0.003)
    bounds = [b for b, _ in lag.cumulative()]
    counts = [n for _, n in lag.cumulative()]
    assert bounds == [*LAG_BUCKETS, float("inf")]
    assert counts == sorted(counts) and counts[-1] == 200

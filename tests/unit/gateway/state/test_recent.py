"""Decayed routed-load sums: exact decay, epoch rebasing, and sums that replicas can add up."""

from __future__ import annotations

import pytest

from gateway.state.memory import MemoryLoadBoard
from gateway.state.protocols import WorkerLoad
from gateway.state.recent import SLOTS, RecentConfig, RecentSums, decayed
from policies.placement import Placement


def test_a_sum_halves_every_half_life() -> None:
    now = [1000.0]
    sums = RecentSums(RecentConfig(half_life_s=10.0), clock=lambda: now[0])
    sums.add("w", 800, cached_tokens=600, placement=Placement.NEW_STREAM)
    assert sums.value("w", now[0]) == pytest.approx((800.0, 1.0, 600.0, 1.0, 0.0))
    now[0] += 10.0
    sums.add("w", 100, placement=Placement.FOLLOW_UP)
    assert sums.value("w", now[0]) == pytest.approx((500.0, 1.5, 300.0, 0.5, 1.0))
    assert sums.value("w", now[0] + 20.0) == pytest.approx((125.0, 0.375, 75.0, 0.125, 0.25))
    assert sums.value("other", now[0]) == (0.0,) * len(SLOTS)


def test_cached_tokens_never_exceed_the_tokens_routed() -> None:
    sums = RecentSums(RecentConfig(half_life_s=10.0), clock=lambda: 0.0)
    sums.add("w", 100, cached_tokens=160)  # a whole-block hit longer than the prompt
    sums.add("w", 50, cached_tokens=-5)
    assert sums.value("w", 0.0) == pytest.approx((150.0, 2.0, 100.0, 0.0, 0.0))


def test_rebasing_keeps_every_value() -> None:
    now = [595.0]
    sums = RecentSums(RecentConfig(half_life_s=30.0, rebase_s=600.0), clock=lambda: now[0])
    sums.add("w", 1000)
    assert sums.epoch == 0.0
    now[0] = 605.0
    before = sums.value("w", now[0])
    sums.add("x", 1)  # crosses into the next epoch: the stored sums are rescaled
    assert sums.epoch == 600.0
    assert sums.value("w", now[0]) == pytest.approx(before)
    assert before[0] == pytest.approx(1000.0 * 2 ** (-10 / 30))


def test_sums_stay_finite_over_a_long_run() -> None:
    now = [0.0]
    sums = RecentSums(RecentConfig(half_life_s=1.0, rebase_s=60.0), clock=lambda: now[0])
    for _ in range(10_000):  # ~2.8 hours at one request a second, half-life 1 s
        now[0] += 1.0
        sums.add("w", 100)
    tokens, requests, *_ = sums.value("w", sums.now())
    assert tokens == pytest.approx(200.0) and requests == pytest.approx(2.0)  # 100 * (1 + 1/2 + 1/4 ...)
    assert all(v < 1e30 for _, published in sums.items() for v in published)


def test_a_published_sum_is_read_at_any_time_by_anyone() -> None:
    now = [1234.0]
    sums = RecentSums(RecentConfig(half_life_s=10.0), clock=lambda: now[0])
    sums.add("w", 400, cached_tokens=100, placement=Placement.NEW_STREAM)
    (_, published), epoch = next(sums.items()), sums.epoch
    tokens, _, cached, streams, _ = published
    assert decayed(tokens, epoch, 1244.0, 10.0) == pytest.approx(200.0)  # what another replica computes
    assert decayed(cached, epoch, 1244.0, 10.0) == pytest.approx(50.0)
    assert decayed(streams, epoch, 1244.0, 10.0) == pytest.approx(0.5)


def test_memory_board_reports_recent_load_on_its_clock() -> None:
    now = [50.0]
    board = MemoryLoadBoard(RecentConfig(half_life_s=5.0), clock=lambda: now[0])
    board.add_routed("w", 300, cached_tokens=200, placement=Placement.FOLLOW_UP)
    now[0] += 5.0
    load = board.get("w")
    assert (load.recent_tokens, load.recent_requests, load.recent_cached_tokens) == pytest.approx(
        (150.0, 0.5, 100.0)
    )
    assert (load.recent_streams, load.recent_follow_ups) == pytest.approx((0.0, 0.5))
    assert set(board.snapshot()) == {"w"}


def test_memory_board_reads_many_workers_at_one_instant() -> None:
    now = [50.0]
    board = MemoryLoadBoard(RecentConfig(half_life_s=5.0), clock=lambda: now[0])
    board.acquire("a", 40)
    board.add_routed("a", 300, cached_tokens=100)
    board.add_routed("b", 80, placement=Placement.NEW_STREAM)
    now[0] += 5.0
    loads = board.loads(["b", "unknown", "a"])
    assert loads == [board.get("b"), WorkerLoad(), board.get("a")]
    assert (loads[2].inflight_requests, loads[2].inflight_tokens, loads[2].recent_tokens) == (1, 40, 150.0)
    assert board.loads([]) == []


def test_rebasing_is_checked_on_every_read_even_after_a_long_silence() -> None:
    now = [10.0]
    sums = RecentSums(RecentConfig(half_life_s=100.0, rebase_s=60.0), clock=lambda: now[0])
    sums.add("w", 1000)
    now[0] = 10.0 + 3 * 60.0  # three epochs later, nothing routed in between
    assert sums.value("w", sums.now()) == pytest.approx((1000.0 * 2 ** (-1.8), 2 ** (-1.8), 0.0, 0.0, 0.0))
    assert sums.epoch == 180.0
    now[0] = 239.0  # still in that epoch: nothing moves
    assert sums.now() == 239.0 and sums.epoch == 180.0


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError):
        RecentConfig(half_life_s=0)

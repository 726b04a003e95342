"""LoadBoard conformance, written once and run against the memory and the Redis backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.state.protocols import LoadBoard, WorkerLoad
from policies.placement import Placement


@pytest.fixture(params=["memory", "redis"])
async def board(request: pytest.FixtureRequest) -> AsyncIterator[LoadBoard]:
    if request.param == "memory":
        from gateway.state.memory import MemoryLoadBoard

        yield MemoryLoadBoard()
        return
    from gateway.state.redis import open_redis_state

    async with open_redis_state(request.getfixturevalue("redis_url")) as state:
        yield state.load


def test_unknown_worker_has_no_load(board: LoadBoard) -> None:
    assert board.get("nobody") == WorkerLoad(0, 0)


def test_acquire_counts_requests_and_tokens(board: LoadBoard) -> None:
    board.acquire("a", 100)
    board.acquire("a", 50)
    board.acquire("b", 7)
    assert board.get("a") == WorkerLoad(inflight_requests=2, inflight_tokens=150)
    assert board.get("b") == WorkerLoad(1, 7)


def test_release_undoes_acquire(board: LoadBoard) -> None:
    board.acquire("a", 100)
    board.acquire("a", 50)
    board.release("a", 100)
    assert board.get("a") == WorkerLoad(1, 50)


def test_counters_never_go_below_zero(board: LoadBoard) -> None:
    board.release("a", 10)
    board.acquire("a", 5)
    board.release("a", 5)
    board.release("a", 5)
    assert board.get("a") == WorkerLoad(0, 0)


def test_snapshot_lists_every_worker_seen(board: LoadBoard) -> None:
    board.acquire("a", 1)
    board.acquire("b", 2)
    snap = board.snapshot()
    assert snap["a"] == WorkerLoad(1, 1)
    assert snap["b"] == WorkerLoad(1, 2)


def test_snapshot_is_a_copy(board: LoadBoard) -> None:
    board.acquire("a", 1)
    snap = dict(board.snapshot())
    board.acquire("a", 1)
    assert snap["a"] == WorkerLoad(1, 1)


def test_routed_work_shows_as_recent_load(board: LoadBoard) -> None:
    board.add_routed("a", 100, cached_tokens=80, placement=Placement.FOLLOW_UP)
    board.acquire("a", 10)
    board.release("a", 10)
    board.add_routed("a", 50, placement=Placement.NEW_STREAM)
    board.add_routed("a", -5)  # nonsense tokens count as 0, the request still counts
    load = board.get("a")
    assert (load.inflight_requests, load.inflight_tokens) == (0, 0)
    assert load.recent_tokens == pytest.approx(150, rel=0.01)  # a 30 s half-life: ~no decay within a test
    assert load.recent_requests == pytest.approx(3, rel=0.01)
    assert load.recent_cached_tokens == pytest.approx(80, rel=0.01)
    assert (load.recent_streams, load.recent_follow_ups) == (
        pytest.approx(1, rel=0.01),
        pytest.approx(1, rel=0.01),
    )
    assert board.snapshot()["a"].recent_tokens == pytest.approx(150, rel=0.01)
    assert board.get("nobody").recent_tokens == 0.0

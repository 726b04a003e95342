"""Redis-specific behaviour of the shared load board: replicas see each other, Redis down degrades."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.state.protocols import WorkerLoad
from gateway.state.redis import RedisLoadBoard, RedisLoadConfig, open_redis_state
from gateway.state.redis_client import open_redis
from policies.placement import Placement
from tests.support.redis_server import new_redis_server
from tests.support.waiting import eventually

pytestmark = pytest.mark.redis

FAST = RedisLoadConfig(sync_interval_s=0.02, key_ttl_s=1.0, discover_interval_s=0.05)


async def test_replicas_see_each_others_inflight_work(redis_url: str) -> None:
    async with (
        open_redis_state(redis_url, config=FAST) as one,
        open_redis_state(redis_url, config=FAST) as two,
    ):
        one.load.acquire("w1", 100)
        two.load.acquire("w1", 20)
        two.load.acquire("w2", 5)
        await eventually(lambda: one.load.get("w1") == WorkerLoad(2, 120))
        await eventually(lambda: two.load.get("w1") == WorkerLoad(2, 120))
        assert one.load.snapshot()["w2"] == WorkerLoad(1, 5)
        two.load.release("w1", 20)
        await eventually(lambda: one.load.get("w1") == WorkerLoad(1, 100))


async def test_replicas_see_the_same_recent_routed_load(redis_url: str) -> None:
    async with (
        open_redis_state(redis_url, config=FAST) as one,
        open_redis_state(redis_url, config=FAST) as two,
    ):
        one.load.add_routed("w1", 1000, cached_tokens=900, placement=Placement.FOLLOW_UP)
        two.load.add_routed("w1", 24, cached_tokens=16, placement=Placement.FOLLOW_UP)
        two.load.add_routed("w2", 7, placement=Placement.NEW_STREAM)
        near = lambda x: pytest.approx(x, rel=0.01)  # noqa: E731 - 30 s half-life, a test takes < 1 s
        await eventually(lambda: one.load.get("w1").recent_tokens == near(1024))
        await eventually(lambda: two.load.get("w1").recent_tokens == near(1024))
        assert two.load.get("w1").recent_requests == near(2)
        await eventually(lambda: two.load.get("w1").recent_cached_tokens == near(916))
        await eventually(lambda: one.load.get("w1").recent_cached_tokens == near(916))
        await eventually(lambda: one.load.snapshot()["w2"].recent_tokens == near(7))
        await eventually(lambda: one.load.get("w1").recent_follow_ups == near(2))
        await eventually(lambda: one.load.get("w2").recent_streams == near(1))
        assert two.load.get("w1").recent_streams == 0.0
        # read together (the routing snapshot): the same figures as one at a time, the others' included
        together = one.load.loads(["w2", "none", "w1"])
        alone = [one.load.get("w2"), WorkerLoad(), one.load.get("w1")]
        for a, b in zip(together, alone, strict=True):
            assert a.astuple() == pytest.approx(b.astuple(), rel=1e-4)  # decayed by the µs between reads


async def test_a_closed_replica_no_longer_counts(redis_url: str) -> None:
    async with open_redis_state(redis_url, config=FAST) as one:
        async with open_redis_state(redis_url, config=FAST) as two:
            await eventually(lambda: one.load.replicas() == two.load.replicas() == 2)  # before any traffic
            await eventually(lambda: {one.load.rank(), two.load.rank()} == {0, 1})  # one position each
            two.load.acquire("w1", 10)
            await eventually(lambda: one.load.get("w1") == WorkerLoad(1, 10))
        await eventually(lambda: one.load.get("w1") == WorkerLoad(0, 0))
        await eventually(lambda: one.load.replicas() == 1)
        await eventually(lambda: one.load.rank() == 0)


async def test_redis_down_answers_local_figures_and_recovers(tmp_path: Path) -> None:
    server = new_redis_server(tmp_path / "redis")
    try:
        async with (
            open_redis_state(server.url, config=FAST) as one,
            open_redis_state(server.url, config=FAST) as two,
        ):
            board_one, board_two = one.load, two.load
            assert isinstance(board_one, RedisLoadBoard) and isinstance(board_two, RedisLoadBoard)
            one.load.acquire("w1", 10)
            two.load.acquire("w1", 1)
            await eventually(lambda: one.load.get("w1") == WorkerLoad(2, 11))
            await asyncio.to_thread(server.stop)
            await eventually(lambda: board_one.degraded)
            assert one.load.get("w1") == WorkerLoad(1, 10)
            assert one.load.replicas() == 1 and one.load.rank() == 0  # alone as far as routing can tell
            one.load.acquire("w1", 10)  # requests are still accounted while degraded
            await asyncio.to_thread(server.start)
            await eventually(lambda: not board_one.degraded and not board_two.degraded, timeout_s=20)
            await eventually(lambda: two.load.get("w1") == WorkerLoad(3, 21))
    finally:
        await asyncio.to_thread(server.stop)


class BodyError(Exception):
    pass


async def test_an_error_in_the_callers_body_comes_out_unwrapped(redis_url: str) -> None:
    with pytest.raises(BodyError):
        async with open_redis_state(redis_url, config=FAST):
            raise BodyError


def test_figures_of_other_versions_are_read_field_by_field() -> None:
    from gateway.state.recent import SLOTS
    from gateway.state.redis import _RECENT_FIELDS, _sum_figures

    assert len(_RECENT_FIELDS) == len(SLOTS)
    older = {b"epoch": b"0", b"w1\x00r": b"1", b"w1\x00s": b"100", b"w1\x00q": b"2"}  # no c, n, f fields
    newer = {b"epoch": b"0", b"w1\x00s": b"50", b"w1\x00n": b"1", b"w1\x00f": b"3", b"w1\x00z": b"9"}
    load = _sum_figures([older, newer], now=0.0, half_life_s=30.0)[0]["w1"]
    assert (load.inflight_requests, load.recent_tokens, load.recent_requests) == (1, 150.0, 2.0)
    assert (load.recent_cached_tokens, load.recent_streams, load.recent_follow_ups) == (0.0, 1.0, 3.0)


def test_packed_figures_are_read_by_letter() -> None:
    import orjson

    from gateway.state.redis import _sum_figures

    newer = {b"epoch": b"0", b"v": orjson.dumps({"k": "rtsqxf", "w": {"w1": [1, 10, 100.0, 2.0, 9.0, 3.0]}})}
    older = {b"epoch": b"0", b"w1\x00r": b"2", b"w1\x00t": b"5", b"w1\x00n": b"1", b"w2\x00s": b"7"}
    figures, bad = _sum_figures([newer, older], now=0.0, half_life_s=30.0)
    assert bad == 0
    w1 = figures["w1"]  # "x" is not a letter this version knows; "c" and "n" are missing from ``newer``
    assert (w1.inflight_requests, w1.inflight_tokens) == (3, 15)
    assert (w1.recent_tokens, w1.recent_requests, w1.recent_cached_tokens) == (100.0, 2.0, 0.0)
    assert (w1.recent_streams, w1.recent_follow_ups) == (1.0, 3.0)
    assert figures["w2"].recent_tokens == 7.0


def test_packed_recent_sums_decay_from_their_epoch() -> None:
    import orjson

    from gateway.state.redis import _sum_figures

    fields = {b"epoch": b"0", b"v": orjson.dumps({"k": "rtsq", "w": {"w1": [1, 10, 100.0, 2.0]}})}
    load = _sum_figures([fields], now=30.0, half_life_s=30.0)[0]["w1"]
    assert (load.inflight_requests, load.recent_tokens, load.recent_requests) == (1, 50.0, 1.0)


@pytest.mark.parametrize(
    "bad",
    [
        {b"epoch": b"0", b"v": b"not json"},
        {b"epoch": b"0", b"v": b'{"w": {}}'},
        {b"epoch": b"0", b"v": b'{"k": "rt", "w": {"w1": ["x", 1]}}'},
        {b"epoch": b"0", b"v": b'{"k": "rt", "w": [1, 2]}'},
        {b"epoch": b"soon", b"w1\x00r": b"1"},
        {b"w1\x00r": b"one"},
    ],
)
def test_a_malformed_hash_is_skipped_not_fatal(bad: dict[bytes, bytes]) -> None:
    from gateway.state.redis import _sum_figures

    good = {b"epoch": b"0", b"w1\x00r": b"1"}
    figures, skipped = _sum_figures([bad, good], now=0.0, half_life_s=30.0)
    assert figures["w1"].inflight_requests == 1 and skipped == 1


async def test_a_replica_writes_one_field_per_figure_only_while_an_older_reader_shares_the_board(
    redis_url: str,
) -> None:
    import orjson
    from redis.asyncio import Redis

    from gateway.state.redis import KEY_PREFIX

    redis = Redis.from_url(redis_url)

    async def own_fields_until(pred: Callable[[dict[bytes, bytes]], bool]) -> dict[bytes, bytes]:
        for _ in range(500):
            fields = await redis.hgetall(board.key)
            if pred(fields):
                return fields
            await asyncio.sleep(0.01)
        raise TimeoutError("condition not met")

    try:
        async with open_redis_state(redis_url, config=FAST) as one:
            board = one.load
            assert isinstance(board, RedisLoadBoard)
            board.acquire("w1", 10)
            fields = await own_fields_until(lambda f: b"v" in f and b"w1" in f[b"v"])
            assert set(fields) == {b"epoch", b"v", b"c"}  # packed only, and when the change was made
            await redis.hset(KEY_PREFIX + "older", mapping={"epoch": 0, "w2\x00r": 3})  # an older replica
            await redis.pexpire(KEY_PREFIX + "older", 300)
            await eventually(lambda: board.get("w2").inflight_requests == 3)  # read in its layout
            fields = await own_fields_until(lambda f: b"w1\x00r" in f)  # and written in its layout
            assert fields[b"w1\x00r"] == b"1" and fields[b"w1\x00t"] == b"10"
            await eventually(lambda: board.get("w2").inflight_requests == 0)  # the older replica left
            board.acquire("w1", 5)
            fields = await own_fields_until(lambda f: orjson.loads(f[b"v"])["w"]["w1"][:2] == [2, 15])
            await asyncio.sleep(0.1)  # a few more syncs
            assert (await redis.hgetall(board.key))[b"w1\x00r"] == b"1"  # no longer kept up
    finally:
        await redis.aclose()


async def test_a_board_syncs_at_the_busy_pace_under_traffic_and_at_the_idle_pace_without(
    redis_url: str,
) -> None:
    config = RedisLoadConfig(
        sync_interval_s=0.5, busy_sync_interval_s=0.02, key_ttl_s=5.0, discover_interval_s=0.05
    )
    async with (
        open_redis_state(redis_url, config=config) as one,
        open_redis_state(redis_url, config=config) as two,
    ):
        a, b = one.load, two.load
        assert isinstance(a, RedisLoadBoard) and isinstance(b, RedisLoadBoard)
        await eventually(lambda: a.replicas() == b.replicas() == 2)
        await eventually(lambda: not a.busy and not b.busy)
        before = a.num_syncs
        await asyncio.sleep(1.0)
        assert a.num_syncs - before <= 4  # idle: about one sync per 0.5 s
        a.acquire("w1", 10)  # wakes the idle board at once; the other pulls it within its idle interval
        await eventually(lambda: b.get("w1") == WorkerLoad(1, 10), timeout_s=5.0)
        before_a, before_b = a.num_syncs, b.num_syncs
        for _ in range(50):  # traffic on one replica: both follow it at the busy pace
            a.add_routed("w1", 10)
            await asyncio.sleep(0.02)
        assert a.num_syncs - before_a >= 10
        assert b.num_syncs - before_b >= 10
        await eventually(lambda: not a.busy and not b.busy, timeout_s=5.0)  # traffic over: idle again


async def test_a_pull_that_finds_nothing_new_mid_burst_keeps_the_busy_pace_until_the_hold_ends(
    redis_url: str,
) -> None:
    """Another replica pushes every busy interval; a pull landing between two of its pushes sees no change,
    and the board stays busy for ``busy_hold_s`` after the last change it saw instead of idling."""
    now = [100.0]
    config = RedisLoadConfig(busy_hold_s=0.05, discover_interval_s=0.0)
    async with open_redis(redis_url) as redis:
        a = RedisLoadBoard(redis, config=config, clock=lambda: now[0])
        b = RedisLoadBoard(redis, config=config, clock=lambda: now[0])
        try:
            await b.sync_once()
            a.add_routed("w1", 10)
            await a.sync_once()
            await b.sync_once()  # sees a's change
            assert b.busy
            now[0] += 0.03
            await b.sync_once()  # nothing new since: within the hold
            assert b.busy
            now[0] += 0.03
            await b.sync_once()  # nothing new, the hold is over
            assert not b.busy
        finally:
            await redis.delete(a.key, b.key)


async def test_a_board_measures_how_late_it_took_in_another_replicas_changes(redis_url: str) -> None:
    config = RedisLoadConfig(sync_interval_s=0.05, key_ttl_s=5.0, discover_interval_s=0.0)
    sender_wall, receiver_wall = [1000.0], [1000.0]
    async with open_redis(redis_url) as client:
        one = RedisLoadBoard(client, replica_id="lag-a", config=config, wall_clock=lambda: sender_wall[0])
        two = RedisLoadBoard(client, replica_id="lag-b", config=config, wall_clock=lambda: receiver_wall[0])
        one.acquire("w1", 10)  # a change the receiver never saw happen: its first pull only notes it
        await one.sync_once()
        await two.sync_once()
        assert two.get("w1") == WorkerLoad(1, 10)
        assert two.lag.count == 0
        sender_wall[0] = 1001.0
        one.release("w1", 10)  # the oldest change of the next push...
        sender_wall[0] = 1001.1
        one.acquire("w2", 5)  # ...not this later one
        await one.sync_once()
        receiver_wall[0] = 1001.25
        await two.sync_once()
        assert two.lag.count == 1
        assert two.lag.sum == pytest.approx(0.25)
        await two.sync_once()  # nothing new from the sender: nothing more to count
        await one.sync_once()  # a push without changes keeps the stamp of the last one that had some
        await two.sync_once()
        assert two.lag.count == 1
        sender_wall[0] = 1002.0
        one.release("w2", 5)
        await one.sync_once()
        receiver_wall[0] = 1002.004
        await two.sync_once()
        assert two.lag.count == 2
        buckets = dict(two.lag.cumulative())
        assert (buckets[0.003], buckets[0.005], buckets[0.2], buckets[0.5]) == (0, 1, 1, 2)
        assert one.lag.count == 0  # the receiver made no change
        await client.delete(one.key, two.key)

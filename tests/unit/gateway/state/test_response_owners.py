"""The record of which worker stored each Responses API response: bounded, shared by replicas, outage-safe."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.state.redis_client import open_redis
from gateway.state.response_owners import MemoryResponseOwners, OwnersConfig, RedisResponseOwners
from tests.support.redis_server import new_redis_server


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_memory_record_is_an_lru_bounded_in_count() -> None:
    owners = MemoryResponseOwners(OwnersConfig(max_entries=3))
    for i in range(3):
        await owners.record(f"r{i}", f"w{i}")
    assert await owners.owner("r0") == "w0"  # r0 is now the most recent
    await owners.record("r3", "w3")
    assert len(owners) == 3
    assert await owners.owner("r1") is None  # the least recently used went
    assert [await owners.owner(r) for r in ("r0", "r2", "r3")] == ["w0", "w2", "w3"]


async def test_memory_record_forgets_after_its_ttl_and_on_delete() -> None:
    clock = Clock()
    owners = MemoryResponseOwners(OwnersConfig(ttl_s=10.0), clock)
    await owners.record("a", "w1")
    await owners.record("b", "w2")
    clock.now = 9.9
    assert await owners.owner("a") == "w1"
    await owners.forget("b")
    assert await owners.owner("b") is None
    clock.now = 10.0
    assert await owners.owner("a") is None
    assert len(owners) == 0


async def test_memory_record_holds_its_bound_under_churn() -> None:
    owners = MemoryResponseOwners(OwnersConfig(max_entries=100))
    for i in range(10_000):
        await owners.record(f"resp_{i}", f"w{i % 7}")
    assert len(owners) == 100
    assert await owners.owner("resp_9999") == "w3"


@pytest.mark.redis
async def test_replicas_share_the_record_through_redis(redis_url: str) -> None:
    async with open_redis(redis_url) as one_client, open_redis(redis_url) as two_client:
        one, two = RedisResponseOwners(one_client), RedisResponseOwners(two_client)
        await one.record("resp_shared", "w2")
        assert await two.owner("resp_shared") == "w2"
        await two.forget("resp_shared")
        assert await one.owner("resp_shared") is None
        await one.record("x", "w1")
        assert 0 < await one_client.ttl("kvgate:resp:x") <= 24 * 3600  # bounded in age


@pytest.mark.redis
async def test_redis_down_answers_from_this_replicas_own_record(tmp_path: Path) -> None:
    server = new_redis_server(tmp_path)
    try:
        async with open_redis(server.url) as client:
            owners = RedisResponseOwners(client)
            await owners.record("before", "w1")
            server.stop()
            await owners.record("during", "w2")  # never raises
            assert await owners.owner("before") == "w1"
            assert await owners.owner("during") == "w2"
            assert await owners.owner("unknown") is None
            await owners.forget("during")
            assert await owners.owner("during") is None
    finally:
        server.stop()

"""KVIndex conformance, written once and run against every backend.

``memory``: a ``MemoryKVIndex`` fed directly. ``redis``: the index a gateway replica looks up with
``--state redis://…`` (its local copy), fed by another party publishing to the real ``kvgate:events`` stream
on a real redis-server; ``apply`` waits until the replica's reader has applied the entry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.kvindex.backplane.stream import publish_events
from gateway.kvindex.index import KVIndex, PrefixHit
from gateway.kvindex.memory import MemoryIndexConfig, MemoryKVIndex
from gateway.kvindex.service import KVServiceConfig, open_kv_service
from kvgate_core.kvcontract.events import EventType, KVEvent, Tier


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    index: KVIndex
    clock: FakeClock
    redis: Any = None
    service: Any = None

    async def apply(self, *events: KVEvent) -> None:
        if self.redis is None:
            for event in events:
                self.index.apply(event)
            return
        entry_id = await publish_events(self.redis, events)
        assert entry_id is not None
        await self.service.wait_for_stream(entry_id)


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    clock = FakeClock()
    config = MemoryIndexConfig(prediction_ttl_s=2.0)
    if request.param == "memory":
        yield Backend(index=MemoryKVIndex(config, clock=clock), clock=clock)
        return
    from redis.asyncio import Redis

    url = request.getfixturevalue("redis_url")
    async with (
        httpx.AsyncClient() as client,
        open_kv_service(
            state_url=url, block_size=16, client=client, clock=clock, config=KVServiceConfig(index=config)
        ) as service,
    ):
        writer = Redis.from_url(url)
        try:
            yield Backend(index=service.index, clock=clock, redis=writer, service=service)
        finally:
            await writer.aclose()


def stored(worker: str, hashes: Sequence[int], tier: Tier = Tier.GPU) -> KVEvent:
    return KVEvent(worker=worker, type=EventType.STORED, tier=tier, hashes=tuple(hashes))


def removed(worker: str, hashes: Sequence[int], tier: Tier = Tier.GPU) -> KVEvent:
    return KVEvent(worker=worker, type=EventType.REMOVED, tier=tier, hashes=tuple(hashes))


def cleared(worker: str, tier: Tier = Tier.GPU) -> KVEvent:
    return KVEvent(worker=worker, type=EventType.CLEARED, tier=tier)


def gpu(backend: Backend, hashes: Sequence[int], worker: str) -> int:
    return backend.index.longest_prefix(hashes, [worker])[worker].gpu_blocks


async def test_empty_index_answers_zero_for_every_worker_asked(backend: Backend) -> None:
    hits = backend.index.longest_prefix([1, 2, 3], ["a", "b"])
    assert dict(hits) == {"a": PrefixHit(), "b": PrefixHit()}
    assert backend.index.num_blocks() == 0


async def test_leading_blocks_are_counted_per_worker(backend: Backend) -> None:
    await backend.apply(stored("a", [1, 2, 3]), stored("b", [1]))
    hits = backend.index.longest_prefix([1, 2, 3, 4], ["a", "b", "c"])
    assert hits["a"] == PrefixHit(3, 0)
    assert hits["b"] == PrefixHit(1, 0)
    assert hits["c"] == PrefixHit(0, 0)


async def test_a_hole_ends_the_match(backend: Backend) -> None:
    await backend.apply(stored("a", [1, 3, 4]))
    assert gpu(backend, [1, 2, 3, 4], "a") == 1


async def test_stored_and_removed_are_idempotent(backend: Backend) -> None:
    await backend.apply(stored("a", [1, 2]), stored("a", [1, 2]))
    assert backend.index.num_blocks() == 2
    await backend.apply(removed("a", [2]), removed("a", [2]))
    assert gpu(backend, [1, 2], "a") == 1
    assert backend.index.num_blocks() == 1


async def test_removed_on_one_worker_keeps_the_other_worker(backend: Backend) -> None:
    await backend.apply(stored("a", [1, 2]), stored("b", [1, 2]), removed("a", [1]))
    hits = backend.index.longest_prefix([1, 2], ["a", "b"])
    assert (hits["a"].gpu_blocks, hits["b"].gpu_blocks) == (0, 2)


async def test_shared_tier_continues_after_the_gpu_match(backend: Backend) -> None:
    await backend.apply(stored("a", [1, 2]), stored("x", [3, 4], Tier.DRAM), stored("x", [5], Tier.SSD))
    hits = backend.index.longest_prefix([1, 2, 3, 4, 5, 6], ["a", "b"])
    assert hits["a"] == PrefixHit(gpu_blocks=2, tier_blocks=3)
    assert hits["b"] == PrefixHit(gpu_blocks=0, tier_blocks=0)  # block 1 is in no tier


async def test_tier_blocks_count_from_the_first_block_for_a_cold_worker(backend: Backend) -> None:
    await backend.apply(stored("x", [1, 2], Tier.DRAM))
    assert backend.index.longest_prefix([1, 2, 3], ["cold"])["cold"] == PrefixHit(0, 2)


async def test_cleared_drops_one_worker_gpu_blocks(backend: Backend) -> None:
    await backend.apply(stored("a", [1, 2]), stored("b", [1, 2]), stored("x", [1], Tier.DRAM))
    await backend.apply(cleared("a"))
    hits = backend.index.longest_prefix([1, 2], ["a", "b"])
    assert hits["a"] == PrefixHit(0, 1)
    assert hits["b"] == PrefixHit(2, 0)


async def test_remove_worker_forgets_its_blocks(backend: Backend) -> None:
    await backend.apply(stored("a", [1, 2]), stored("b", [1]))
    backend.index.remove_worker("a")
    assert gpu(backend, [1, 2], "a") == 0
    assert gpu(backend, [1, 2], "b") == 1


async def test_prediction_counts_until_its_ttl(backend: Backend) -> None:
    backend.index.record_routed("a", [1, 2, 3])
    assert gpu(backend, [1, 2, 3], "a") == 3
    backend.clock.now += 5.0
    assert gpu(backend, [1, 2, 3], "a") == 0


async def test_removed_event_supersedes_a_prediction(backend: Backend) -> None:
    backend.index.record_routed("a", [1, 2, 3])
    await backend.apply(removed("a", [2]))
    assert gpu(backend, [1, 2, 3], "a") == 1


async def test_stored_event_outlives_the_prediction_it_confirms(backend: Backend) -> None:
    backend.index.record_routed("a", [1, 2])
    await backend.apply(stored("a", [1, 2]))
    backend.clock.now += 5.0
    assert gpu(backend, [1, 2], "a") == 2


async def test_worker_blocks_follow_stores_removals_and_clears(backend: Backend) -> None:
    await backend.apply(stored("a", [1, 2, 3]), stored("b", [2, 3]), stored("a", [3, 3]))
    backend.index.record_routed("c", [7, 8])  # a prediction is no block of the worker's
    blocks = backend.index.worker_blocks()
    assert (blocks["a"], blocks["b"], blocks.get("c", 0)) == (3, 2, 0)
    await backend.apply(removed("a", [1, 9]), removed("a", [1]), cleared("b"))
    assert (backend.index.worker_blocks()["a"], backend.index.worker_blocks().get("b", 0)) == (2, 0)
    backend.index.remove_worker("a")
    assert backend.index.worker_blocks().get("a", 0) == 0

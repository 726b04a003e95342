"""KV service feeds against real HTTP servers (a fake worker's /kv/blocks + /kv/events SSE) and real Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.kvindex.backplane.relay import RedisBackplane
from gateway.kvindex.feeds.kvgate import BlocksSnapshot, FeedConfig
from gateway.kvindex.service import KVService, KVServiceConfig, open_kv_service
from kvgate_core.kvcontract.events import EVENTS_STREAM, EventType, KVEvent, Tier
from tests.support.fake_kv_worker import FakeKVWorker
from tests.support.procs import free_port
from tests.support.redis_server import new_redis_server
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

FAST = KVServiceConfig(backoff_initial_s=0.05, backoff_max_s=0.2, relay_lease_s=0.6)


def gpu_blocks(service: KVService, worker: str, hashes: list[int]) -> int:
    return service.index.longest_prefix(hashes, [worker])[worker].gpu_blocks


def stored(worker: str, hashes: list[int], tier: Tier = Tier.GPU) -> KVEvent:
    return KVEvent(worker=worker, type=EventType.STORED, tier=tier, hashes=tuple(hashes))


@pytest.fixture
async def worker() -> AsyncIterator[FakeKVWorker]:
    w = FakeKVWorker("self-a")
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


async def test_snapshot_then_events_land_under_the_registry_id(
    worker: FakeKVWorker, client: httpx.AsyncClient
) -> None:
    worker.tiers = {"gpu": [1, 2], "dram": [3]}
    async with open_kv_service(state_url="memory", block_size=16, client=client, config=FAST) as service:
        service.add_worker("reg-a", worker.url)
        await eventually(lambda: gpu_blocks(service, "reg-a", [1, 2, 3]) == 2)
        assert service.index.longest_prefix([1, 2, 3], ["reg-a"])["reg-a"].tier_blocks == 1
        await eventually(lambda: worker.num_subscribers == 1)
        worker.emit([stored("self-a", [3, 4])])
        await eventually(lambda: gpu_blocks(service, "reg-a", [1, 2, 3, 4]) == 4)
        assert gpu_blocks(service, "self-a", [1]) == 0
        assert service.aliases.resolve("self-a") == "reg-a"


async def test_reconnect_rebuilds_from_a_fresh_snapshot(
    worker: FakeKVWorker, client: httpx.AsyncClient
) -> None:
    worker.tiers = {"gpu": [1, 2]}
    async with open_kv_service(state_url="memory", block_size=16, client=client, config=FAST) as service:
        service.add_worker("reg-a", worker.url)
        await eventually(lambda: gpu_blocks(service, "reg-a", [1, 2]) == 2)
        worker.tiers = {"gpu": [7]}  # the worker restarted with another cache
        worker.drop_connections()
        await eventually(lambda: gpu_blocks(service, "reg-a", [7]) == 1)
        assert gpu_blocks(service, "reg-a", [1, 2]) == 0
        assert worker.num_snapshots >= 2


async def test_worker_with_another_block_size_is_not_indexed(client: httpx.AsyncClient) -> None:
    odd = FakeKVWorker("odd", block_size=32)
    odd.tiers = {"gpu": [1]}
    await odd.start()
    try:
        async with open_kv_service(state_url="memory", block_size=16, client=client, config=FAST) as service:
            service.add_worker("reg-odd", odd.url)
            await eventually(lambda: odd.num_snapshots >= 2)
            assert gpu_blocks(service, "reg-odd", [1]) == 0
    finally:
        await odd.stop()


async def test_a_backend_without_an_event_stream_is_retried_not_indexed(client: httpx.AsyncClient) -> None:
    from aiohttp import web

    hits: list[str] = []

    async def events(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(status=404, text="no such route")

    app = web.Application()
    app.router.add_get("/kv/events", events)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with open_kv_service(state_url="memory", block_size=16, client=client, config=FAST) as service:
            service.add_worker("reg-x", f"http://127.0.0.1:{port}")
            await eventually(lambda: len(hits) >= 3)  # answered 404, retried with backoff, never crashed
            assert gpu_blocks(service, "reg-x", [1]) == 0
            assert not service.workers["reg-x"].done()
    finally:
        await runner.cleanup()


async def test_remove_worker_stops_the_feed_and_forgets_blocks(
    worker: FakeKVWorker, client: httpx.AsyncClient
) -> None:
    worker.tiers = {"gpu": [1]}
    async with open_kv_service(state_url="memory", block_size=16, client=client, config=FAST) as service:
        service.add_worker("reg-a", worker.url)
        await eventually(lambda: gpu_blocks(service, "reg-a", [1]) == 1)
        task = service.workers["reg-a"]
        service.remove_worker("reg-a")
        await eventually(task.done)
        assert gpu_blocks(service, "reg-a", [1]) == 0
        worker.emit([stored("self-a", [1])])
        await asyncio.sleep(0.05)  # nothing may arrive: no condition to poll for an absence
        assert gpu_blocks(service, "reg-a", [1]) == 0


async def stream_entries_mentioning(redis: Redis, needle: bytes) -> int:
    entries: list[tuple[bytes, dict[bytes, bytes]]] = await redis.xrange(EVENTS_STREAM)  # type: ignore[assignment]
    return sum(needle in fields[b"e"] for _id, fields in entries)


async def test_two_replicas_share_one_relay_per_worker(
    worker: FakeKVWorker, client: httpx.AsyncClient, redis_url: str
) -> None:
    worker.tiers = {"gpu": [1]}
    redis = Redis.from_url(redis_url)
    async with (
        open_kv_service(state_url=redis_url, block_size=16, client=client, config=FAST) as one,
        open_kv_service(state_url=redis_url, block_size=16, client=client, config=FAST) as two,
    ):
        one.add_worker("reg-a", worker.url)
        two.add_worker("reg-a", worker.url)
        await eventually(lambda: worker.num_subscribers >= 1)
        marker = 987_654_321_012
        worker.emit([stored("self-a", [1, marker])])
        await eventually(lambda: gpu_blocks(one, "reg-a", [1, marker]) == 2)
        await eventually(lambda: gpu_blocks(two, "reg-a", [1, marker]) == 2)
        assert not one.degraded and not two.degraded
        assert worker.num_subscribers == 1
        assert await stream_entries_mentioning(redis, str(marker).encode()) == 1
        # the relay stamps when it got each batch; both replicas (the relaying one too) measure the lag
        for replica in (one, two):
            lag = replica.replica_lags()["kv_events"]
            assert lag.count >= 1 and 0.0 <= lag.sum < 5.0 * lag.count
    await redis.aclose()


async def test_redis_down_degrades_then_recovers_by_itself(
    worker: FakeKVWorker, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    server = new_redis_server(tmp_path / "redis")
    try:
        async with open_kv_service(
            state_url=server.url, block_size=16, client=client, config=FAST
        ) as service:
            service.add_worker("reg-a", worker.url)
            await eventually(lambda: worker.num_subscribers == 1)
            worker.emit([stored("self-a", [1])])
            await eventually(lambda: gpu_blocks(service, "reg-a", [1]) == 1)

            await asyncio.to_thread(server.stop)
            await eventually(lambda: service.degraded)
            service.index.record_routed("reg-a", [1, 2])  # routing keeps working on the local copy
            assert gpu_blocks(service, "reg-a", [1, 2]) == 2
            await eventually(lambda: worker.num_subscribers == 1)  # followed directly while degraded
            worker.emit([stored("self-a", [1, 2, 3])])
            await eventually(lambda: gpu_blocks(service, "reg-a", [1, 2, 3]) == 3)

            await asyncio.to_thread(server.start)
            await eventually(lambda: not service.degraded, timeout_s=20)
            await eventually(lambda: worker.num_subscribers == 1 and worker.num_snapshots >= 3)
            worker.emit([stored("self-a", [1, 2, 3, 4])])
            await eventually(lambda: gpu_blocks(service, "reg-a", [1, 2, 3, 4]) == 4)
            redis = Redis.from_url(server.url)
            assert await stream_entries_mentioning(redis, b"4") >= 1
            await redis.aclose()
    finally:
        await asyncio.to_thread(server.stop)


class _FlakyPublish(Redis):
    """A real Redis client whose XADD fails while ``failing`` is set: a publish lost while the lease renews."""

    failing = False

    async def xadd(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing:
            raise RedisConnectionError("XADD lost")
        return await super().xadd(*args, **kwargs)


async def test_a_lead_that_lost_a_publish_leads_afresh_from_a_new_snapshot(
    worker: FakeKVWorker, client: httpx.AsyncClient, redis_url: str
) -> None:
    # An outage shorter than the lease renewal is seen by a publish only; the stream then has a gap that
    # only a new snapshot closes.
    redis = cast("_FlakyPublish", _FlakyPublish.from_url(redis_url))
    local_events: list[KVEvent] = []

    async def on_local_snapshot(snapshot: BlocksSnapshot) -> None:
        pass

    async def on_local_events(events: Sequence[KVEvent]) -> None:
        local_events.extend(events)

    backplane = RedisBackplane(
        redis=redis, client=client, feed=FeedConfig(block_size=16, backoff_initial_s=0.05, backoff_max_s=0.2),
        apply=lambda events: None, on_routed=lambda worker, hashes: None, clock=lambda: 0.0,
        token="replica-1", lease_s=0.3, maxlen=10_000, warn_interval_s=60.0,
    )  # fmt: skip
    task = asyncio.create_task(
        backplane.follow_worker("reg-gap", worker.url, (on_local_snapshot, on_local_events))
    )
    try:
        await eventually(lambda: worker.num_subscribers == 1)
        snapshots = worker.num_snapshots
        marker = 424_242_424_242
        redis.failing = True
        worker.tiers = {"gpu": [1, marker]}
        worker.emit([stored("self-a", [1, marker])])
        await eventually(lambda: any(marker in e.hashes for e in local_events))  # kept locally meanwhile
        redis.failing = False
        await eventually(lambda: worker.num_snapshots > snapshots)
        await eventually(lambda: worker.num_subscribers == 1)
        assert backplane.degraded  # the failed publish was seen
        check = Redis.from_url(redis_url)
        try:
            await eventually_async(lambda: stream_entries_mentioning(check, str(marker).encode()), at_least=1)
        finally:
            await check.aclose()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await redis.aclose()


async def eventually_async(
    count: Callable[[], Awaitable[int]], *, at_least: int, timeout_s: float = 10.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while await count() < at_least:
        if loop.time() > deadline:
            raise TimeoutError(f"fewer than {at_least} within {timeout_s}s")
        await asyncio.sleep(0.02)


async def test_a_prediction_made_on_one_replica_is_seen_by_another(
    client: httpx.AsyncClient, redis_url: str
) -> None:
    async with (
        open_kv_service(state_url=redis_url, block_size=16, client=client, config=FAST) as one,
        open_kv_service(state_url=redis_url, block_size=16, client=client, config=FAST) as two,
    ):
        one.index.record_routed("reg-a", [1, 2, 3])
        assert gpu_blocks(one, "reg-a", [1, 2, 3]) == 3  # local at once
        await eventually(lambda: gpu_blocks(two, "reg-a", [1, 2, 3]) == 3)
        assert gpu_blocks(one, "reg-b", [1]) == 0
        received, sent = two.replica_lags()["prediction"], one.replica_lags()["prediction"]
        assert received.count == 1 and 0.0 <= received.sum < 5.0  # how late it came
        assert sent.count == 0  # a replica reads its own entries back, and skips them


async def test_a_replica_that_stops_hands_its_relay_leases_over(
    worker: FakeKVWorker, client: httpx.AsyncClient, redis_url: str
) -> None:
    worker.tiers = {"gpu": [1]}
    redis = Redis.from_url(redis_url)
    slow = KVServiceConfig(backoff_initial_s=0.05, backoff_max_s=0.2, relay_lease_s=60.0)
    async with open_kv_service(state_url=redis_url, block_size=16, client=client, config=slow) as one:
        one.add_worker("reg-a", worker.url)
        await eventually(lambda: worker.num_subscribers == 1)
    assert await redis.get("kvgate:relay:reg-a") is None  # not left to expire in 60 s
    await redis.aclose()

from __future__ import annotations

import httpx
import pytest

from gateway.kvindex.approximate import ApproximateIndexConfig, ApproximateKVIndex
from gateway.kvindex.capacity import CapacityConfig
from gateway.kvindex.hybrid import HybridKVIndex
from gateway.kvindex.memory import MemoryKVIndex
from gateway.kvindex.service import KVServiceConfig, open_kv_service


async def test_memory_state_gives_a_precise_index_that_is_not_degraded() -> None:
    async with (
        httpx.AsyncClient() as client,
        open_kv_service(state_url="memory", block_size=16, client=client) as kv,
    ):
        assert isinstance(kv.index, HybridKVIndex) and isinstance(kv.index.precise, MemoryKVIndex)
        assert kv.worker_mode("w") == "precise" and kv.quiet_mode == "none"  # the --kv-index precise override
        assert not kv.degraded


async def test_following_the_fleet_a_worker_is_approximate_until_a_feed_makes_it_precise() -> None:
    async with (
        httpx.AsyncClient() as client,
        open_kv_service(
            state_url="memory", block_size=16, client=client, config=KVServiceConfig(follow_fleet=True)
        ) as kv,
    ):
        assert kv.worker_mode("w") == "approximate" and kv.quiet_mode == "approximate"
        kv.set_capacity("w", 64)  # its engine's tokens: 4 of the gateway's 16-token blocks
        kv.index.record_routed("w", list(range(10)))
        assert kv.index.worker_blocks() == {"w": int(4 * CapacityConfig().headroom)}  # kept with headroom
        assert kv.set_mode("w", "precise") and not kv.set_mode("w", "precise")
        assert kv.index.longest_prefix([0, 1], ["w"])["w"].gpu_blocks == 0


async def test_approximate_mode_needs_no_feeds() -> None:
    config = KVServiceConfig(approximate=ApproximateIndexConfig(capacity_blocks=8, ttl_s=60))
    async with (
        httpx.AsyncClient() as client,
        open_kv_service(state_url="memory", block_size=16, client=client, config=config) as kv,
    ):
        assert isinstance(kv.index, ApproximateKVIndex)
        kv.add_worker("a", "http://127.0.0.1:1")  # no events to follow: nothing is started
        assert kv.workers == {}
        kv.index.record_routed("a", [1, 2])
        assert kv.index.longest_prefix([1, 2], ["a"])["a"].gpu_blocks == 2


async def test_unknown_state_url_is_refused() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ValueError, match="redis://"):
            async with open_kv_service(state_url="etcd://x", block_size=16, client=client):
                pass


class BodyError(Exception):
    pass


@pytest.mark.parametrize("state", ["memory", "redis"])
async def test_an_error_in_the_callers_body_comes_out_unwrapped(
    state: str, request: pytest.FixtureRequest
) -> None:
    url = "memory" if state == "memory" else request.getfixturevalue("redis_url")
    async with httpx.AsyncClient() as client:
        with pytest.raises(BodyError):
            async with open_kv_service(state_url=url, block_size=16, client=client):
                raise BodyError


@pytest.mark.redis
async def test_the_backplane_runs_on_the_client_it_is_handed_and_leaves_it_open(redis_url: str) -> None:
    from gateway.kvindex.backplane.stream import publish_events
    from gateway.state.redis_client import RedisClientSettings, open_redis
    from kvgate_core.kvcontract.events import EventType, KVEvent, Tier

    event = KVEvent(worker="w", type=EventType.STORED, tier=Tier.GPU, hashes=(1, 2))
    async with open_redis(redis_url, RedisClientSettings(client_name="shared")) as redis:
        async with (
            httpx.AsyncClient() as client,
            open_kv_service(state_url=redis_url, redis=redis, block_size=16, client=client) as kv,
        ):
            entry_id = await publish_events(redis, [event])
            assert entry_id is not None
            await kv.wait_for_stream(entry_id)
            assert kv.index.longest_prefix([1, 2], ["w"])["w"].gpu_blocks == 2
            names = {c["name"] for c in await redis.client_list()} - {""}  # unnamed: other tests' clients
            assert names == {"shared"}  # no client of the service's own (it would be "kvgate-gateway")
        assert await redis.ping()  # still open: the state closes it, not the service


@pytest.mark.redis
async def test_a_replica_measures_how_late_relayed_events_are_applied(redis_url: str) -> None:
    import time

    from gateway.kvindex.backplane.stream import publish_events
    from gateway.state.redis_client import open_redis
    from kvgate_core.kvcontract.events import EventType, KVEvent, Tier

    stored = KVEvent(worker="w", type=EventType.STORED, tier=Tier.GPU, hashes=(7, 8))
    async with (
        open_redis(redis_url) as redis,
        httpx.AsyncClient() as client,
        open_kv_service(state_url=redis_url, redis=redis, block_size=16, client=client) as kv,
    ):
        lags = kv.replica_lags()
        assert set(lags) == {"prediction", "kv_events"}
        await kv.wait_for_stream(await publish_events(redis, [stored]) or b"")  # no stamp: an older relay
        assert lags["kv_events"].count == 0
        received_at = time.time() - 0.2  # as if the relaying replica got it from its worker 200 ms ago
        entry_id = await publish_events(redis, [stored], received_at=received_at)
        await kv.wait_for_stream(entry_id or b"")
        assert lags["kv_events"].count == 1
        assert 0.2 <= lags["kv_events"].sum < 5.0
        await redis.xadd("kvgate:events", {b"e": b"[]", b"t": b"soon"})  # a bad stamp: applied, not counted
        entry_id = await publish_events(redis, [stored], received_at=time.time())
        await kv.wait_for_stream(entry_id or b"")
        assert lags["kv_events"].count == 2


async def test_a_gateway_on_memory_state_measures_no_replica_lag() -> None:
    async with (
        httpx.AsyncClient() as client,
        open_kv_service(state_url="memory", block_size=16, client=client) as kv,
    ):
        assert kv.replica_lags() == {}

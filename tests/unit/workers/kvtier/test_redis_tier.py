"""Redis tier specifics: key names, TTL, config validation (the shared behaviour is in conformance)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from kvgate_core.kvcontract.wire import BlockLayout, BlockMeta, pack_block
from tests.support.redis_server import new_redis_server
from workers.kvtier.redis_tier import RedisTier, RedisTierConfig, block_key

LAYOUT = BlockLayout(num_layers=1, block_size=4, dtype="uint8", shape=(64,))


def test_key_follows_the_contract() -> None:
    assert block_key("kvgate:kv", "org/m", 0xAB) == "kvgate:kv:org/m:00000000000000ab"


async def test_ttl_is_set_on_every_block(redis_url: str) -> None:
    tier = RedisTier(RedisTierConfig(redis_url, "m", layout=LAYOUT, ttl_s=30.0))
    await tier.put_many([(1, pack_block(BlockMeta.of("m", 1, LAYOUT), bytes(64)))])
    raw = aioredis.Redis.from_url(redis_url)
    ttl_ms = await raw.pttl(block_key("kvgate:kv", "m", 1))
    await raw.aclose()
    await tier.aclose()
    assert 0 < ttl_ms <= 30_000


@pytest.mark.parametrize(
    "cfg",
    [
        RedisTierConfig("http://x", "m"),
        RedisTierConfig("redis://x", "m", timeout_s=0),
        RedisTierConfig("redis://x", "m", ttl_s=-1),
    ],
    ids=["scheme", "timeout", "ttl"],
)
def test_bad_config_fails_fast(cfg: RedisTierConfig) -> None:
    with pytest.raises(ValueError, match="must"):
        RedisTier(cfg)


async def test_a_stalled_server_answers_misses_within_the_deadline_then_recovers(tmp_path: Path) -> None:
    server = new_redis_server(tmp_path)
    try:
        tier = RedisTier(RedisTierConfig(server.url, "m", layout=LAYOUT, timeout_s=0.3))
        value = pack_block(BlockMeta.of("m", 1, LAYOUT), bytes(64))
        await tier.put_many([(1, value)])
        admin = aioredis.Redis.from_url(server.url)
        await admin.client_pause(1000)  # the server stops answering for a second
        await admin.aclose()
        assert await tier.get_many([1]) == [None]
        assert tier.stats().errors == 1  # (is_degraded during an outage: see the conformance suite)
        deadline = asyncio.get_running_loop().time() + 20
        while await tier.get_many([1]) != [value]:  # a timed-out call must not poison the pool
            assert asyncio.get_running_loop().time() < deadline, "the tier did not recover"
        assert not tier.is_degraded
        await tier.aclose()
    finally:
        server.stop()

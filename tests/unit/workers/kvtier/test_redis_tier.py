"""Redis tier specifics: key names, TTL, config validation (the shared behaviour is in conformance)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from gateway.kvcontract.wire import BlockLayout, BlockMeta, pack_block
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

"""Shared rate-limit buckets on a real redis-server, and their fallback when Redis is gone."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from gateway.security.buckets import MemoryBuckets, Rate, RedisBuckets
from tests.support.redis_server import new_redis_server


async def test_two_replicas_share_one_bucket(redis_url: str) -> None:
    a_client, b_client = aioredis.from_url(redis_url), aioredis.from_url(redis_url)
    try:
        a = RedisBuckets(a_client, MemoryBuckets())
        b = RedisBuckets(b_client, MemoryBuckets())
        rate = Rate(per_minute=3)
        waits = [await a.take("k", 1, rate), await b.take("k", 1, rate), await a.take("k", 1, rate)]
        assert waits == [0.0, 0.0, 0.0]
        assert await b.take("k", 1, rate) > 0.0  # the fourth, from either replica, must wait
        assert await a.take("other", 1, rate) == 0.0
    finally:
        await a_client.aclose()
        await b_client.aclose()


async def test_redis_outage_falls_back_to_local_buckets(tmp_path: Path) -> None:
    server = new_redis_server(tmp_path)
    client = aioredis.from_url(server.url, socket_timeout=0.2, socket_connect_timeout=0.2)
    try:
        buckets = RedisBuckets(client, MemoryBuckets(), timeout_s=0.5)
        assert await buckets.take("k", 1, Rate(2)) == 0.0
        server.stop()
        assert await buckets.take("k", 1, Rate(2)) == 0.0  # served from the local bucket
        assert buckets.degraded
        server.start()
        assert await buckets.take("fresh", 1, Rate(2)) == 0.0
        assert not buckets.degraded
    finally:
        await client.aclose()
        server.stop()

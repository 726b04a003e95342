"""Shared rate-limit buckets on a real redis-server, and their fallback when Redis is gone."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import redis.asyncio as aioredis

from gateway.security.buckets import MemoryBuckets, Rate, RedisBuckets
from tests.support.redis_server import new_redis_server


async def test_two_replicas_share_one_bucket(redis_url: str) -> None:
    a_client, b_client = aioredis.from_url(redis_url), aioredis.from_url(redis_url)
    try:
        a = RedisBuckets(lambda: a_client, MemoryBuckets())
        b = RedisBuckets(lambda: b_client, MemoryBuckets())
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
    client = aioredis.from_url(server.url, socket_timeout=2.0, socket_connect_timeout=1.0)
    try:
        buckets = RedisBuckets(lambda: client, MemoryBuckets(), timeout_s=0.5)
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


async def test_no_client_yet_means_local_buckets_then_shared_once_it_is_open(redis_url: str) -> None:
    slot: list[aioredis.Redis] = []
    buckets = RedisBuckets(lambda: slot[0] if slot else None, MemoryBuckets())
    rate = Rate(per_minute=1)
    assert await buckets.take("k", 1, rate) == 0.0  # before the lifespan opens the client: local
    assert not buckets.degraded
    slot.append(aioredis.from_url(redis_url))
    try:
        assert await buckets.take("k", 1, rate) == 0.0  # the shared bucket is still full
        assert await buckets.take("k", 1, rate) > 0.0
        assert await slot[0].exists("kvgate:rl:k") == 1
    finally:
        await slot[0].aclose()


async def test_a_dead_redis_is_given_up_on_within_the_per_call_deadline(tmp_path: Path) -> None:
    """The shared client's socket timeout is seconds long; the check's own deadline bounds each call."""
    server = new_redis_server(tmp_path)
    client = aioredis.from_url(server.url, socket_timeout=2.0, socket_connect_timeout=1.0)
    try:
        buckets = RedisBuckets(lambda: client, MemoryBuckets(), timeout_s=0.05)
        assert await buckets.take("k", 1, Rate(2)) == 0.0
        proc = server.proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)  # alive but silent: only a deadline ends the wait
        try:
            started = time.monotonic()
            assert await buckets.take("k", 1, Rate(2)) == 0.0
            assert time.monotonic() - started < 0.2
            assert buckets.degraded
        finally:
            proc.send_signal(signal.SIGCONT)
    finally:
        await client.aclose()
        server.stop()

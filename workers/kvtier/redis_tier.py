"""DRAM tier: KV blocks in Redis (one server or a Redis Cluster), shared by the fleet.

Keys are ``kvgate:kv:{model}:{hash:016x}`` (no braces: in a cluster the blocks of a model spread over all
slots). Every batch is one round trip: ``MGET`` (``mget_nonatomic`` on a cluster) for reads, a
non-transactional pipeline of ``SET``/``EXISTS``/``UNLINK`` for the rest.

Capacity is Redis's own job: run the server with ``maxmemory <bytes>`` and ``maxmemory-policy allkeys-lru``
(or ``allkeys-lfu``) and it evicts the least recently read blocks. The client keeps no index, because an
index in the client would be one more copy to keep consistent across a fleet of writers, and Redis already
tracks access recency. ``ttl_s`` optionally bounds how long a block lives. The cost is that evictions are
silent (no ``removed`` event); ``LayeredTier`` writes blocks to SSD as well, so an evicted block still hits.

Outages degrade: a failed or slow batch (``timeout_s``) answers misses, ``is_degraded`` turns true, a
warning is logged at most every ``log_interval_s``; nothing raises into the token path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from kvgate_core.kvcontract.wire import BlockLayout
from workers.kvtier.block_check import BlockChecker, Verdict, tally
from workers.kvtier.events import TierEvents
from workers.kvtier.protocols import leading_present
from workers.kvtier.stats import TierStats

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RedisTierConfig:
    """Settings of a Redis DRAM tier.

    Attributes:
        url: ``redis://host:port/db`` (or ``rediss://``).
        model: the model id (part of the key, and checked in every value read).
        layout: when given, values of another block layout are misses.
        cluster: connect with the Redis Cluster client.
        ttl_s: expiry of each stored block; ``None`` keeps blocks until Redis evicts them.
        timeout_s: deadline of one batch operation, connection included.
        key_prefix: first part of every key.
        log_interval_s: at most one outage warning per interval.
        read_size_bytes: socket read size; KV values are hundreds of KiB, and redis-py's 64 KiB default
            costs about a third of the read bandwidth (measured with ``loadtest.bench_tier``).
    """

    url: str
    model: str
    layout: BlockLayout | None = None
    cluster: bool = False
    ttl_s: float | None = None
    timeout_s: float = 1.0
    key_prefix: str = "kvgate:kv"
    log_interval_s: float = 10.0
    read_size_bytes: int = 1 << 20

    def validate(self) -> None:
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"DRAM tier URL {self.url!r} must start with redis://, rediss:// or unix://")
        if self.timeout_s <= 0 or (self.ttl_s is not None and self.ttl_s <= 0):
            raise ValueError("timeout_s and ttl_s must be positive")


def block_key(prefix: str, model: str, block_hash: int) -> str:
    """The Redis key of a block (the tier's key layout: ``kvgate:kv:{model}:{hash:016x}``)."""
    return f"{prefix}:{model}:{block_hash:016x}"


def _connect(cfg: RedisTierConfig) -> Any:
    # One quick retry without backoff: after a server restart the pooled connection is stale, the retry
    # reconnects; a longer retry loop would only hold the token path hostage (timeout_s caps it anyway).
    opts: dict[str, Any] = {
        "socket_timeout": cfg.timeout_s,
        "socket_connect_timeout": cfg.timeout_s,
        "retry": Retry(NoBackoff(), 1),
        "socket_read_size": cfg.read_size_bytes,
    }
    if cfg.cluster:
        return RedisCluster.from_url(cfg.url, **opts)
    return aioredis.Redis.from_url(cfg.url, **opts)


class RedisTier:
    """``WritableTier`` on Redis. See the module docstring for keys, capacity and outages."""

    def __init__(
        self,
        config: RedisTierConfig,
        *,
        client: Any | None = None,
        events: TierEvents | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config.validate()
        self._cfg = config
        self._client = client if client is not None else _connect(config)
        self._events = events
        self._clock = clock
        self._check = BlockChecker(config.model, config.layout)
        self._stats = TierStats()
        self._degraded = False
        self._last_warning = -float("inf")

    @property
    def is_degraded(self) -> bool:
        return self._degraded

    def stats(self) -> TierStats:
        return self._stats.snapshot()

    def _keys(self, hashes: Sequence[int]) -> list[str]:
        prefix, model = self._cfg.key_prefix, self._cfg.model
        return [block_key(prefix, model, h) for h in hashes]

    async def _guarded(self, op: str, call: Callable[[], Awaitable[T]], default: T) -> T:
        try:
            async with asyncio.timeout(self._cfg.timeout_s):
                result = await call()
        except (RedisError, OSError, TimeoutError) as exc:
            self._stats.errors += 1
            self._degraded = True
            now = self._clock()
            if now - self._last_warning >= self._cfg.log_interval_s:
                self._last_warning = now
                logger.warning("DRAM tier %s failed (%s: %s); serving misses", op, type(exc).__name__, exc)
            return default
        self._degraded = False
        return result

    async def get_many(self, hashes: Sequence[int]) -> list[bytes | None]:
        if not hashes:
            return []
        keys = self._keys(hashes)
        if self._cfg.cluster:
            values = await self._guarded("get", lambda: self._client.mget_nonatomic(keys), None)
        else:
            values = await self._guarded("get", lambda: self._client.mget(keys), None)
        if values is None:
            self._stats.misses += len(hashes)
            return [None] * len(hashes)
        return self._verified(hashes, values)

    def _verified(self, hashes: Sequence[int], values: Sequence[bytes | None]) -> list[bytes | None]:
        out: list[bytes | None] = []
        verdicts: list[Verdict] = []
        for h, value in zip(hashes, values, strict=True):
            if value is not None:
                verdict = self._check.verdict(value, h)
                verdicts.append(verdict)
                if verdict is not Verdict.OK:
                    value = None
            out.append(value)
        tally(self._stats, verdicts)
        hits = [v for v in out if v is not None]
        self._stats.hits += len(hits)
        self._stats.misses += len(out) - len(hits)
        self._stats.read_bytes += sum(len(v) for v in hits)
        return out

    async def _pipeline(self, add: Callable[[Any], None]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        add(pipe)
        result: list[Any] = await pipe.execute()
        return result

    async def exists_many(self, hashes: Sequence[int]) -> list[bool]:
        if not hashes:
            return []
        keys = self._keys(hashes)

        def add(pipe: Any) -> None:
            for k in keys:
                pipe.exists(k)

        counts = await self._guarded("exists", lambda: self._pipeline(add), [0] * len(keys))
        return [bool(c) for c in counts]

    async def contains_prefix(self, hashes: Sequence[int]) -> int:
        return leading_present(await self.exists_many(hashes))

    async def put_many(self, blocks: Sequence[tuple[int, bytes]]) -> int:
        if not blocks:
            return 0
        prefix, model = self._cfg.key_prefix, self._cfg.model
        px = None if self._cfg.ttl_s is None else max(1, int(self._cfg.ttl_s * 1000))

        def add(pipe: Any) -> None:
            for h, value in blocks:
                pipe.set(block_key(prefix, model, h), value, px=px)

        done: list[Any] = await self._guarded("put", lambda: self._pipeline(add), [])
        stored = [h for (h, _), ok in zip(blocks, done, strict=False) if ok]
        self._stats.stored_blocks += len(stored)
        self._stats.stored_bytes += sum(len(v) for (_, v), ok in zip(blocks, done, strict=False) if ok)
        if self._events is not None:
            self._events.stored(stored)
        return len(stored)

    async def delete_many(self, hashes: Sequence[int]) -> int:
        if not hashes:
            return 0
        keys = self._keys(hashes)

        def add(pipe: Any) -> None:
            for k in keys:
                pipe.execute_command("UNLINK", k)  # the cluster pipeline has no per-key unlink()

        counts = await self._guarded("delete", lambda: self._pipeline(add), [0] * len(keys))
        removed = [h for h, c in zip(hashes, counts, strict=True) if c]
        if self._events is not None:
            self._events.removed(removed)
        return len(removed)

    async def aclose(self) -> None:
        await self._client.aclose()

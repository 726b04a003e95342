"""Token buckets for per-key request and token rate limits: in memory, or in Redis for replicas.

``take(key, amount)`` returns 0.0 when the amount was granted, else the seconds to wait before it could
be (the ``Retry-After``). Buckets start full; capacity is one minute's worth of the rate.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

logger = logging.getLogger(__name__)

RedisProvider = Callable[[], "Redis | None"]
"""The gateway's Redis client while it is open, else None; called at every check (see ``RedisBuckets``)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """``per_minute`` units a minute, with a burst of one minute's worth."""

    per_minute: float

    @property
    def per_second(self) -> float:
        return self.per_minute / 60.0


class BucketStore(Protocol):
    async def take(self, key: str, amount: float, rate: Rate) -> float:
        """Take ``amount`` from ``key``'s bucket; 0.0 if granted, else seconds until it would be."""
        ...


class MemoryBuckets:
    """Process-local buckets; the least recently used keys are dropped past ``max_keys``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self._clock = clock
        self._max_keys = max_keys
        self._state: OrderedDict[str, tuple[float, float]] = OrderedDict()

    async def take(self, key: str, amount: float, rate: Rate) -> float:
        return self.take_now(key, amount, rate)

    def take_now(self, key: str, amount: float, rate: Rate) -> float:
        now = self._clock()
        capacity = rate.per_minute
        level, last = self._state.pop(key, (capacity, now))
        level = min(capacity, level + (now - last) * rate.per_second)
        wait = 0.0
        if amount > level:
            wait = (amount - level) / rate.per_second if rate.per_second > 0 else 60.0
        else:
            level -= amount
        self._state[key] = (level, now)
        if len(self._state) > self._max_keys:
            self._state.popitem(last=False)
        return wait


# KEYS[1] bucket key; ARGV: amount, capacity, per_second, now. Returns the wait in ms (0 = granted).
_LUA: Final = """
local b = redis.call('HMGET', KEYS[1], 'level', 'ts')
local cap = tonumber(ARGV[2]); local rate = tonumber(ARGV[3]); local now = tonumber(ARGV[4])
local level = tonumber(b[1]) or cap; local ts = tonumber(b[2]) or now
level = math.min(cap, level + math.max(0, now - ts) * rate)
local amount = tonumber(ARGV[1]); local wait = 0
if amount > level then wait = math.ceil((amount - level) / rate * 1000) else level = level - amount end
redis.call('HSET', KEYS[1], 'level', level, 'ts', now)
redis.call('EXPIRE', KEYS[1], math.ceil(cap / rate) + 60)
return wait
"""


class RedisBuckets:
    """Buckets shared by every gateway replica (one Lua script call per check).

    A Redis error, or no answer within ``timeout_s`` (each call's own deadline: the shared client's socket
    timeout is longer), falls back to process-local buckets (logged): limits become per replica, requests
    are still served.

    The client is the gateway's one Redis client, asked of ``redis`` at each check: these layers wrap the
    app from outside the lifespan that opens it. Until it is open (None) the local buckets answer.
    """

    def __init__(self, redis: RedisProvider, fallback: MemoryBuckets, timeout_s: float = 0.05) -> None:
        self._redis = redis
        self._bound: tuple[Redis, AsyncScript] | None = None  # the client and the script registered on it
        self._fallback = fallback
        self._timeout_s = timeout_s
        self.degraded = False

    def _script(self) -> AsyncScript | None:
        client = self._redis()
        if client is None:
            return None
        if self._bound is None or self._bound[0] is not client:
            self._bound = (client, client.register_script(_LUA))
        return self._bound[1]

    async def take(self, key: str, amount: float, rate: Rate) -> float:
        import asyncio

        import redis

        script = self._script()
        if script is None:
            return self._fallback.take_now(key, amount, rate)
        try:
            async with asyncio.timeout(self._timeout_s):
                wait_ms = await script(
                    keys=[f"kvgate:rl:{key}"], args=[amount, rate.per_minute, rate.per_second, time.time()]
                )
        except (redis.RedisError, OSError, TimeoutError) as exc:
            if not self.degraded:
                logger.warning("rate limits fall back to per-replica buckets: Redis error %s", exc)
            self.degraded = True
            return self._fallback.take_now(key, amount, rate)
        self.degraded = False
        return float(wait_ms) / 1000.0

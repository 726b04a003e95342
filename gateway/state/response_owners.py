"""Which worker stored each Responses API response: what ``previous_response_id`` is routed by.

Engines keep stored responses in their own memory, so a request continuing one, and ``GET``/``DELETE``/
``cancel`` of it, must reach the worker that created it. The gateway records ``response id → worker`` when
a worker's answer names the id (before the client sees it), bounded in count and age:

- ``MemoryResponseOwners``: one gateway; an LRU of ``max_entries`` with a TTL.
- ``RedisResponseOwners``: several replicas; ``SET kvgate:resp:{id} worker EX ttl`` so a follow-up landing
  on another replica finds the owner, over a local ``MemoryResponseOwners`` that answers alone while Redis
  is unreachable (what this replica recorded stays routable; a warning is logged once per interval).

Nothing here is on the chat path: only the Responses API reads or writes it.
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

logger = logging.getLogger(__name__)

KEY_PREFIX: Final = "kvgate:resp:"


@dataclass(frozen=True, slots=True)
class OwnersConfig:
    """Bounds of the record: entries kept per replica, and how long one lives (a day by default)."""

    max_entries: int = 100_000
    ttl_s: float = 24 * 3600.0
    warn_interval_s: float = 30.0


class ResponseOwners(Protocol):
    """``response id → worker id``; every method is safe to call while the backing store is down."""

    async def record(self, response_id: str, worker: str) -> None: ...

    async def owner(self, response_id: str) -> str | None: ...

    async def forget(self, response_id: str) -> None: ...


class MemoryResponseOwners:
    """An LRU of at most ``max_entries`` ids, each forgotten ``ttl_s`` after it was recorded."""

    def __init__(
        self, config: OwnersConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config or OwnersConfig()
        self._clock = clock
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def record(self, response_id: str, worker: str) -> None:
        self.put(response_id, worker)

    def put(self, response_id: str, worker: str) -> None:
        self._entries[response_id] = (worker, self._clock() + self._config.ttl_s)
        self._entries.move_to_end(response_id)
        while len(self._entries) > self._config.max_entries:
            self._entries.popitem(last=False)

    async def owner(self, response_id: str) -> str | None:
        return self.get(response_id)

    def get(self, response_id: str) -> str | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._entries[response_id]
            return None
        self._entries.move_to_end(response_id)
        return entry[0]

    async def forget(self, response_id: str) -> None:
        self._entries.pop(response_id, None)


class RedisResponseOwners:
    """The record shared by replicas through Redis, with a local copy for outages (module docstring)."""

    def __init__(
        self, redis: Redis, config: OwnersConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._redis = redis
        self._config = config or OwnersConfig()
        self._local = MemoryResponseOwners(self._config, clock)
        self._clock = clock
        self._warned_at: float | None = None

    async def record(self, response_id: str, worker: str) -> None:
        self._local.put(response_id, worker)
        try:
            await self._redis.set(KEY_PREFIX + response_id, worker, ex=max(1, int(self._config.ttl_s)))
        except Exception as exc:  # noqa: BLE001 - Redis down: the local copy answers for this replica
            self._down(exc)

    async def owner(self, response_id: str) -> str | None:
        try:
            value = await self._redis.get(KEY_PREFIX + response_id)
        except Exception as exc:  # noqa: BLE001 - Redis down: the local copy answers for this replica
            self._down(exc)
            return self._local.get(response_id)
        if value is None:
            return None  # Redis is the truth while it answers (another replica may have deleted it)
        return value.decode() if isinstance(value, bytes) else str(value)

    async def forget(self, response_id: str) -> None:
        await self._local.forget(response_id)
        try:
            await self._redis.delete(KEY_PREFIX + response_id)
        except Exception as exc:  # noqa: BLE001 - Redis down: the key expires by itself
            self._down(exc)

    def _down(self, exc: BaseException) -> None:
        now = self._clock()
        if self._warned_at is None or now - self._warned_at >= self._config.warn_interval_s:
            self._warned_at = now
            logger.warning(
                "response owners: Redis unreachable (%s); answering from this replica's record", exc
            )

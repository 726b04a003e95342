"""The gateway's one Redis client: ``open_redis(url)``, opened with the state backend (``open_state``).

One gateway process holds one client per ``--state redis://…`` URL, so one URL check, one set of timeouts
and one connection pool serve every Redis user: the load board (``gateway.state.redis``), the KV backplane
(``gateway.kvindex``) and the rate-limit buckets (``gateway.security.buckets``). Users with tighter latency
needs bound their own calls (the rate-limit check wraps each call in ``asyncio.timeout``); the socket
timeout only has to let the longest blocking command (``MAX_BLOCK_S``) finish.

``redis.asyncio`` is imported inside ``open_redis``: a memory-only gateway never loads the Redis client.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from redis.asyncio import Redis

REDIS_SCHEMES: Final = ("redis://", "rediss://", "unix://")
MAX_BLOCK_S: Final = 1.0
"""The longest a user of the client blocks a command server-side (the KV stream's ``XREAD BLOCK``)."""

_BLOCK_MARGIN_S: Final = 0.5


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis server (``redis://``, ``rediss://`` or ``unix://``)."""
    return url.startswith(REDIS_SCHEMES)


@dataclass(frozen=True, slots=True)
class RedisClientSettings:
    """Connection settings of the one client; the defaults need no change.

    Attributes:
        connect_timeout_s: deadline of a TCP connect (Redis down: the board degrades after it).
        socket_timeout_s: deadline of one reply; at least ``MAX_BLOCK_S`` + 0.5 s, so the KV stream's
            blocking read returns before it.
        max_connections: cap of the one pool (each concurrent command holds a connection; the board and
            the backplane hold a few, concurrent rate-limit checks the rest). Past it a command fails
            with a ``ConnectionError``, which every user treats as Redis being down.
        client_name: set with ``CLIENT SETNAME`` on every connection (``CLIENT LIST`` shows whose it is);
            ``open_redis_state`` appends the replica id.
    """

    connect_timeout_s: float = 1.0
    socket_timeout_s: float = 2.0
    max_connections: int = 300
    client_name: str | None = "kvgate-gateway"

    def __post_init__(self) -> None:
        if self.socket_timeout_s < MAX_BLOCK_S + _BLOCK_MARGIN_S:
            raise ValueError(
                f"socket_timeout_s={self.socket_timeout_s} must be at least {MAX_BLOCK_S + _BLOCK_MARGIN_S}"
                " (the KV stream blocks reads for up to MAX_BLOCK_S)"
            )
        if self.connect_timeout_s <= 0 or self.max_connections <= 0:
            raise ValueError("connect_timeout_s and max_connections must be positive")


@contextlib.asynccontextmanager
async def open_redis(url: str, settings: RedisClientSettings | None = None) -> AsyncIterator[Redis]:
    """The Redis client named by ``url`` for the context's lifetime; closed (pool included) on exit.

    Nothing connects here: the first command does, so a Redis that is down at start is not an error.

    Raises:
        ValueError: ``url`` is not a Redis URL, or the Redis client cannot parse it.
    """
    if not is_redis_url(url):
        raise ValueError(f"state URL {url!r}: use 'memory' or 'redis://host:port/db'")
    from redis.asyncio import Redis  # imported lazily: memory-only gateways never load the Redis client

    cfg = settings or RedisClientSettings()
    redis = Redis.from_url(
        url,
        socket_connect_timeout=cfg.connect_timeout_s,
        socket_timeout=cfg.socket_timeout_s,
        max_connections=cfg.max_connections,
        client_name=cfg.client_name,
    )
    try:
        yield redis
    finally:
        await redis.aclose()

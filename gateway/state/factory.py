"""``open_state(url)``: the state backend named by ``--state`` (``memory`` or ``redis://…``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.errors import ConfigError
from gateway.state.memory import MemoryLoadBoard
from gateway.state.protocols import State
from gateway.state.recent import RecentConfig
from gateway.state.redis import RedisLoadConfig, open_redis_state
from gateway.state.redis_client import RedisClientSettings, is_redis_url


@asynccontextmanager
async def open_state(
    url: str, recent: RecentConfig | None = None, client: RedisClientSettings | None = None
) -> AsyncIterator[State]:
    """Open the state backend named by ``url``; close it on exit.

    With ``redis://…`` the state holds the gateway's one Redis client (``State.redis``), which the KV
    service and the rate limits use too.

    Args:
        url: ``memory`` or ``redis://…``.
        recent: half-life of the recent routed load (``gateway.state.recent``).
        client: timeouts and pool of the Redis client (defaults when omitted).

    Raises:
        ConfigError: the URL names no known backend.
    """
    recent = recent or RecentConfig()
    if url == "memory":
        yield State(load=MemoryLoadBoard(recent), url=url)
        return
    if is_redis_url(url):
        # gateway.state.redis_client imports the redis client lazily: a memory-only gateway never loads it.
        async with open_redis_state(url, config=RedisLoadConfig(recent=recent), client=client) as state:
            yield state
        return
    raise ConfigError(f"--state {url!r} is not understood; use 'memory' or 'redis://HOST:PORT/DB'")

"""``open_state(url)``: the state backend named by ``--state`` (``memory`` or ``redis://…``)."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

from gateway.errors import ConfigError
from gateway.state.memory import MemoryLoadBoard
from gateway.state.protocols import LoadBoard
from gateway.state.recent import RecentConfig


@dataclass(frozen=True, slots=True)
class State:
    """The state backends of one gateway, opened and closed together by ``open_state``."""

    load: LoadBoard
    url: str = "memory"


@asynccontextmanager
async def open_state(url: str, recent: RecentConfig | None = None) -> AsyncIterator[State]:
    """Open the state backend named by ``url``; close it on exit.

    Args:
        url: ``memory`` or ``redis://…``.
        recent: half-life of the recent routed load (``gateway.state.recent``).

    Raises:
        ConfigError: the URL names no known backend.
    """
    recent = recent or RecentConfig()
    if url == "memory":
        yield State(load=MemoryLoadBoard(recent), url=url)
        return
    if url.startswith(("redis://", "rediss://", "unix://")):
        # Imported lazily so a memory-only gateway never loads the redis client.
        module: Any = importlib.import_module("gateway.state.redis")
        config = module.RedisLoadConfig(recent=recent)
        async with module.open_redis_state(url, config=config) as state:
            yield cast(State, state)
        return
    raise ConfigError(f"--state {url!r} is not understood; use 'memory' or 'redis://HOST:PORT/DB'")

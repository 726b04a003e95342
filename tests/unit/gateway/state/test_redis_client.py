"""The gateway's one Redis client: its settings, where it is opened, and that memory state never loads redis."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from redis.asyncio import Redis

from gateway.state.factory import open_state
from gateway.state.redis import RedisLoadBoard
from gateway.state.redis_client import MAX_BLOCK_S, RedisClientSettings, is_redis_url, open_redis


def test_only_redis_urls_are_redis_urls() -> None:
    assert is_redis_url("redis://h:1/0") and is_redis_url("rediss://h/0") and is_redis_url("unix:///s")
    assert not is_redis_url("memory") and not is_redis_url("etcd://h")


def test_the_socket_timeout_must_outlast_the_longest_blocking_read() -> None:
    with pytest.raises(ValueError, match="socket_timeout_s"):
        RedisClientSettings(socket_timeout_s=MAX_BLOCK_S)
    with pytest.raises(ValueError, match="positive"):
        RedisClientSettings(max_connections=0)


async def test_open_redis_refuses_other_urls() -> None:
    with pytest.raises(ValueError, match="redis://"):
        async with open_redis("etcd://x"):
            pass


@pytest.mark.redis
async def test_open_redis_applies_its_settings_to_every_connection(redis_url: str) -> None:
    settings = RedisClientSettings(
        connect_timeout_s=0.7, socket_timeout_s=3.0, max_connections=7, client_name="t"
    )
    async with open_redis(redis_url, settings) as redis:
        kwargs = redis.connection_pool.connection_kwargs
        assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (0.7, 3.0)
        assert redis.connection_pool.max_connections == 7
        assert await redis.client_getname() == "t"


@pytest.mark.redis
async def test_redis_state_carries_one_named_client_that_the_board_uses(redis_url: str) -> None:
    async with open_state(redis_url) as state:
        assert state.redis is not None
        board = state.load
        assert isinstance(board, RedisLoadBoard)
        assert board._redis is state.redis
        name = f"kvgate-gateway:{board.replica_id}"
        assert await state.redis.client_getname() == name
    admin = Redis.from_url(redis_url)
    try:
        # closed with the state: the pool's connections are gone
        for _ in range(100):
            if not [c for c in await admin.client_list() if c["name"] == name]:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"connections named {name} outlived the state")
    finally:
        await admin.aclose()


async def test_memory_state_has_no_client() -> None:
    async with open_state("memory") as state:
        assert state.redis is None


def test_a_memory_gateway_never_imports_the_redis_client() -> None:
    code = (
        "import asyncio, sys\n"
        "from gateway.deps import open_deps\n"
        "from gateway.server import build_asgi\n"
        "from gateway.state.factory import open_state\n"
        "async def main():\n"
        "    async with open_state('memory') as state:\n"
        "        assert state.redis is None\n"
        "asyncio.run(main())\n"
        "assert not [m for m in sys.modules if m == 'redis' or m.startswith('redis.')], 'redis imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_replies_are_parsed_by_hiredis() -> None:
    """``hiredis`` is a dependency: redis-py then parses replies in C (a load-board sync of 4 replicas costs
    ~0.7x the client CPU of its pure-Python RESP3 parser); a missing or broken install falls back silently."""
    from redis._parsers import _AsyncHiredisParser

    async with open_redis("redis://127.0.0.1:1/0") as redis:  # nothing connects
        pool = redis.connection_pool
        connection = pool.connection_class(**pool.connection_kwargs)
        assert type(connection._parser) is _AsyncHiredisParser

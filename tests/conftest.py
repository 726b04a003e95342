"""Shared fixtures: a real redis-server on loopback, free ports, a locally trained tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import free_port
from tests.support.redis_server import RedisServer, new_redis_server


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session; tests that need a clean one flush it."""
    server = new_redis_server(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    import redis

    redis.Redis(port=redis_server.port).flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def tiny_tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained locally (no download), saved as tokenizer.json."""
    from tests.support.tokenizer import train_tiny_tokenizer

    return train_tiny_tokenizer(tmp_path_factory.mktemp("tok"))

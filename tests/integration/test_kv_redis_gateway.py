"""A gateway with ``--state redis://…`` in front of sim workers: precise hits via the stream, and Redis
killed and restarted under load with zero failed requests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_fleet import Fleet, gateway_fleet
from tests.support.redis_server import RedisServer, new_redis_server
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = new_redis_server(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fleet(tmp_path: Path, redis: RedisServer) -> Iterator[Fleet]:
    args = ("--state", redis.url, "--policy", "prefix_cache_aware", "--tokenizer", "bytes")
    with gateway_fleet(tmp_path, num_workers=2, gateway_args=args) as f:
        yield f


def complete(client: httpx.Client, fleet: Fleet, prompt: list[int]) -> httpx.Response:
    body = {"model": "kvgate-sim", "prompt": prompt, "max_tokens": 2}
    return client.post(f"{fleet.gateway}/v1/completions", json=body)


def predicted_hit_after_repeat(client: httpx.Client, fleet: Fleet, prompt: list[int]) -> bool:
    resp = complete(client, fleet, prompt)
    assert resp.status_code == 200, resp.text
    return int(resp.headers.get("x-kvgate-prefix-hit", "0")) >= 64


def test_redis_killed_and_restarted_under_load_fails_no_request(fleet: Fleet, redis: RedisServer) -> None:
    prompts = [list(range(base, base + 16 * 8)) for base in range(1000, 1000 * 41, 1000)]
    with httpx.Client(timeout=30) as client:
        assert complete(client, fleet, prompts[0]).status_code == 200
        wait_until(lambda: predicted_hit_after_repeat(client, fleet, prompts[0]), timeout_s=20)
        statuses = []
        deadline = time.monotonic() + 60
        for i, prompt in enumerate(prompts[1:]):
            assert time.monotonic() < deadline
            if i == 5:
                redis.stop()
            if i == 25:
                redis.start()
            statuses.append(complete(client, fleet, prompt).status_code)
        assert statuses == [200] * len(statuses)
        # After the restart the index follows the workers through Redis again.
        wait_until(lambda: predicted_hit_after_repeat(client, fleet, prompts[-1]), timeout_s=30)

"""A gateway process opens one Redis client per ``--state`` URL: the load board, the KV backplane and the
rate-limit buckets share its one connection pool, and ``CLIENT LIST`` shows every connection under its one
name (``kvgate-gateway:{replica id}``, set with ``CLIENT SETNAME`` as each pooled connection opens)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest
import redis

from tests.integration.gateway_fleet import gateway_fleet
from tests.support.redis_server import new_redis_server
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.redis, pytest.mark.timeout(120)]

ADMIN = "test-admin"


def test_board_backplane_and_rate_limits_share_one_client(tmp_path: Path) -> None:
    server = new_redis_server(tmp_path / "redis")
    admin = redis.Redis(port=server.port, client_name=ADMIN, socket_timeout=2.0, decode_responses=True)
    args = ("--state", server.url, "--policy", "prefix_cache_aware", "--tokenizer", "bytes",
            "--rate-limit-rpm", "1000")  # fmt: skip
    try:
        with (
            gateway_fleet(tmp_path, num_workers=2, gateway_args=args) as fleet,
            httpx.Client(timeout=30) as http,
        ):
            for base in range(0, 8 * 64, 64):
                body = {"model": "kvgate-sim", "prompt": list(range(base, base + 64)), "max_tokens": 2}
                resp = http.post(f"{fleet.gateway}/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
            # each user has been through Redis: the board's key, the relays' events, the shared buckets
            wait_until(lambda: bool(admin.keys("kvgate:load:*")) and admin.xlen("kvgate:events") > 0)
            assert admin.keys("kvgate:rl:*")
            [load_key] = admin.keys("kvgate:load:*")
            replica = str(load_key).removeprefix("kvgate:load:")

            def gateway_clients() -> list[dict[str, str]]:
                return [c for c in admin.client_list() if c["name"] != ADMIN]

            def names() -> set[str]:
                return {c["name"] for c in gateway_clients()}

            # polled: a connection opening right now is listed a moment before its CLIENT SETNAME lands
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: names() == {f"kvgate-gateway:{replica}"}, timeout_s=5)
            clients = gateway_clients()
            assert {c["name"] for c in clients} == {f"kvgate-gateway:{replica}"}, clients
            # the blocking stream reads, the board's syncs and the rate-limit checks: several connections
            assert len(clients) >= 3, clients
    finally:
        admin.close()
        server.stop()

"""API keys, rate limits, the concurrency cap, tenant-aware hashing, the control plane's access modes, the
worker allow-list and tenants bound to keys, through real gateway processes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.gateway_fleet import gateway_fleet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MODEL = "kvgate-sim"
MESSAGES = [{"role": "user", "content": "a reasonably long question about kv caches " * 8}]


def test_api_keys_rate_limits_and_admin_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-alpha\nsk-beta\n")
    args = [
        "--api-keys",
        str(keys),
        "--admin-keys",
        "adm-1",
        "--rate-limit-rpm",
        "3",
        "--policy",
        "round_robin",
    ]
    with gateway_fleet(tmp_path, num_workers=1, gateway_args=args) as fleet:
        anon = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anon.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        alpha = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="sk-alpha", max_retries=0)
        for _ in range(3):
            assert alpha.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2).choices
        with pytest.raises(openai.RateLimitError) as exc:
            alpha.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        assert int(exc.value.response.headers["retry-after"]) >= 1
        beta = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="sk-beta", max_retries=0)
        assert beta.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2
        ).choices  # own bucket
        assert (
            httpx.get(
                fleet.gateway + "/admin/workers", headers={"authorization": "Bearer sk-alpha"}
            ).status_code
            == 401
        )
        assert (
            httpx.get(fleet.gateway + "/admin/workers", headers={"authorization": "Bearer adm-1"}).status_code
            == 200
        )
        assert httpx.get(fleet.gateway + "/health").status_code == 200
        assert "sk-alpha" not in fleet.log("gateway.log")


def test_tenant_is_hashed_the_same_on_both_sides(tmp_path: Path) -> None:
    with gateway_fleet(tmp_path, num_workers=2) as fleet:
        client = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="x", max_retries=0)
        for tenant in ("acme", "globex"):
            headers = {"x-kvgate-tenant": tenant}
            first = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers=headers
            )
            second = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers=headers
            )
            usage = second.parse().usage
            assert usage is not None
            assert usage.prompt_tokens_details is not None
            cached = usage.prompt_tokens_details.cached_tokens
            # the second tenant shares no KV with the first one: its first request is a miss everywhere
            assert first.parse().usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
            assert cached and cached > 0
            assert second.headers["x-kvgate-worker"] == first.headers["x-kvgate-worker"]
            assert int(second.headers["x-kvgate-prefix-hit"]) == cached
        metrics = httpx.get(fleet.gateway + "/metrics").text
        realised = _metric(metrics, "kvgate_prefix_realised_tokens_total")
        assert realised >= 2 * cached  # the closed loop saw both tenants' predictions come true
        assert _metric(metrics, "kvgate_prefix_drift") == 0.0


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


class CountingListener:
    """A loopback TCP listener that counts the connections it accepts (each closed at once)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()


@contextmanager
def counting_listener() -> Iterator[CountingListener]:
    listener = CountingListener()
    listener.start()
    try:
        yield listener
    finally:
        listener.close()


def _register(gateway: str, url: str, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gateway}/admin/workers", json={"url": url}, headers=headers, timeout=30)


def test_client_keys_alone_close_the_admin_api(tmp_path: Path) -> None:
    with (
        counting_listener() as target,
        gateway_fleet(tmp_path, num_workers=1, gateway_args=["--api-keys", "sk-alpha"]) as fleet,
    ):
        worker_id = next(iter(fleet.workers))
        for key in (None, "sk-alpha"):
            headers = {"authorization": f"Bearer {key}"} if key else {}
            refused = [
                _register(fleet.gateway, target.url, key),
                httpx.delete(f"{fleet.gateway}/admin/workers/{worker_id}", headers=headers),
                httpx.get(f"{fleet.gateway}/admin/workers", headers=headers),
                httpx.get(f"{fleet.gateway}/admin/ui", headers=headers),
            ]
            for resp in refused:
                assert resp.status_code == 403, resp.request.url
                assert resp.json()["error"]["code"] == "admin_keys_required"
                assert "--admin-keys" in resp.json()["error"]["message"]
        time.sleep(1.5)  # past a health interval: a registered worker would have been probed by now
        assert target.accepted == 0
        for path in ("/health", "/ready", "/metrics"):
            assert httpx.get(fleet.gateway + path).status_code == 200
        alpha = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="sk-alpha", max_retries=0)
        assert alpha.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2
        ).choices  # not drained
        log = fleet.log("gateway.log")
        assert "admin API: closed mode" in log and "sk-alpha" not in log


def test_registration_needs_an_admin_key_and_an_allowed_address(tmp_path: Path) -> None:
    with counting_listener() as allowed, counting_listener() as other:
        args = [
            "--api-keys",
            "sk-alpha",
            "--admin-keys",
            "adm-1",
            "--worker-allow",
            f"127.0.0.1:{allowed.port}",
        ]
        with gateway_fleet(tmp_path, num_workers=1, gateway_args=args) as fleet:
            assert _register(fleet.gateway, allowed.url).status_code == 401
            assert _register(fleet.gateway, allowed.url, "sk-alpha").status_code == 401
            outside = [
                other.url,
                f"http://localhost:{other.port}",
                f"http://[::1]:{other.port}",
                f"http://127.0.0.1:{allowed.port}@127.0.0.1:{other.port}",
                "http://10.1.2.3:80",  # never contacted: refused before any connection
                "http://169.254.169.254/latest/meta-data",
            ]
            for url in outside:
                resp = _register(fleet.gateway, url, "adm-1")
                assert resp.status_code == 403, url
                assert resp.json()["error"]["code"] == "worker_not_allowed"
            added = _register(fleet.gateway, allowed.url, "adm-1")
            assert added.status_code == 201
            assert added.json()["healthy"] is False  # the listener hangs up: registered, never healthy
            listed = httpx.get(f"{fleet.gateway}/admin/workers", headers={"authorization": "Bearer adm-1"})
            time.sleep(1.5)
            assert other.accepted == 0
            assert allowed.accepted >= 1  # the control: a registration that passes does connect
        assert sorted(w["url"] for w in listed.json()["workers"]) == sorted(
            [allowed.url, *(f"http://{wid}" for wid in fleet.workers)]
        )


def test_a_keys_tenant_bounds_its_kv_partition(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-a tenant=a\nsk-b tenant=b\nsk-p\nsk-q\n")
    messages = [
        {"role": "user", "content": "a question that only the tenant test asks, about partitions " * 8}
    ]
    with gateway_fleet(tmp_path, num_workers=1, gateway_args=["--api-keys", str(keys)]) as fleet:

        def cached(key: str, tenant: str | None = None) -> int:
            client = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key=key, max_retries=0)
            headers = {"x-kvgate-tenant": tenant} if tenant else {}
            usage = client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=2, extra_headers=headers
            ).usage
            assert usage is not None and usage.prompt_tokens_details is not None
            return usage.prompt_tokens_details.cached_tokens or 0

        assert cached("sk-a") == 0
        assert cached("sk-a") > 0  # a's partition is warm
        assert cached("sk-b", "a") == 0  # b naming a lands in b/a, never in a
        assert cached("sk-b") == 0  # and b's own partition is not a's
        assert cached("sk-a", "a") == 0  # a narrowing within itself: a/a, a sub-partition
        assert cached("sk-p", "a") == 0  # no tenant on the key: key:<id>/a
        assert cached("sk-p", "a") > 0
        assert cached("sk-q", "a") == 0  # the same claim from another key: a partition of its own
        body = {"model": MODEL, "messages": messages, "max_tokens": 2}
        for tenant_headers in (
            [("x-kvgate-tenant", "b"), ("x-kvgate-tenant", "a")],
            [("x-kvgate-tenant", "a b")],
        ):
            resp = httpx.post(
                f"{fleet.gateway}/v1/chat/completions",
                json=body,
                headers=[("authorization", "Bearer sk-b"), *tenant_headers],
            )
            assert resp.status_code == 400
            assert resp.json()["error"]["param"] == "x-kvgate-tenant"

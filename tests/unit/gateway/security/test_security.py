"""Auth, rate limits and admission as ASGI middlewares around a trivial app."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gateway.security.admission import Admission, AdmissionLimits, AdmissionMiddleware
from gateway.security.auth import AuthMiddleware, KeyRing
from gateway.security.buckets import MemoryBuckets, Rate
from gateway.security.errors import ErrorLayer
from gateway.security.ratelimit import RateLimitMiddleware, RateLimits, estimate_tokens
from kvgate_core.asgi import Receive, Scope, Send


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def ok_app(scope: Scope, receive: Receive, send: Send) -> None:
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    key = (scope.get("state") or {}).get("api_key_id", "-")
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-key", str(key).encode())]})
    await send({"type": "http.response.body", "body": body})


def _client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")  # type: ignore[arg-type]


def test_keyring_reads_files_and_matches(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# team keys\nsk-one\n\nsk-two\n")
    ring = KeyRing.from_file(f)
    assert ring.match("sk-one") and ring.match("sk-two")
    assert ring.match("sk-three") is None and ring.match(None) is None and ring.match("") is None
    assert ring.match("sk-one") != ring.match("sk-two")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        KeyRing.from_file(tmp_path / "empty")


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/v1/chat/completions", {}, 401),
        ("/v1/chat/completions", {"authorization": "Bearer wrong"}, 401),
        ("/v1/chat/completions", {"authorization": "Bearer sk-user"}, 200),
        ("/v1/models", {"x-api-key": "sk-user"}, 200),
        ("/admin/workers", {"authorization": "Bearer sk-user"}, 401),
        ("/admin/workers", {"authorization": "Bearer sk-admin"}, 200),
        ("/health", {}, 200),
        ("/metrics", {}, 200),
    ],
    ids=[
        "no-key",
        "wrong-key",
        "good-key",
        "x-api-key",
        "user-key-on-admin",
        "admin-key",
        "health-open",
        "metrics-open",
    ],
)
async def test_auth_guards_routes(path: str, headers: dict[str, str], status: int) -> None:
    app = ErrorLayer(AuthMiddleware(ok_app, KeyRing.of(["sk-user"]), KeyRing.of(["sk-admin"])))
    async with _client(app) as c:
        r = await c.post(path, headers=headers, content=b"{}")
    assert r.status_code == status
    if status == 401:
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert "sk-" not in r.text


async def test_request_rate_limit_answers_429_with_retry_after() -> None:
    clock = FakeClock()
    app = ErrorLayer(RateLimitMiddleware(ok_app, RateLimits(requests_per_minute=3), MemoryBuckets(clock)))
    async with _client(app) as c:
        codes = [(await c.post("/v1/completions", content=b"{}")).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = await c.post("/v1/completions", content=b"{}")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert (await c.get("/v1/models")).status_code == 200  # not limited
        clock.now += 20.0  # refills one request per 20 s
        assert (await c.post("/v1/completions", content=b"{}")).status_code == 200


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/embeddings", "/v1/messages", "/tokenize"])
async def test_every_route_that_reaches_a_worker_is_rate_limited(path: str) -> None:
    app = ErrorLayer(
        RateLimitMiddleware(ok_app, RateLimits(requests_per_minute=1), MemoryBuckets(FakeClock()))
    )
    async with _client(app) as c:
        assert [(await c.post(path, content=b"{}")).status_code for _ in range(2)] == [200, 429]


async def test_token_rate_limit_charges_prompt_and_max_tokens_and_keeps_the_body() -> None:
    clock = FakeClock()
    app = ErrorLayer(RateLimitMiddleware(ok_app, RateLimits(tokens_per_minute=1000), MemoryBuckets(clock)))
    body = b'{"prompt": "hello", "max_tokens": 600}'
    assert estimate_tokens(body) == len(body) // 4 + 600
    async with _client(app) as c:
        r = await c.post("/v1/completions", content=body)
        assert r.status_code == 200 and r.content == body  # the app still sees the whole body
        assert (await c.post("/v1/completions", content=body)).status_code == 429


async def test_limits_are_per_key() -> None:
    clock = FakeClock()
    limited = RateLimitMiddleware(ok_app, RateLimits(requests_per_minute=1), MemoryBuckets(clock))
    app = ErrorLayer(AuthMiddleware(limited, KeyRing.of(["a", "b"]), None))
    async with _client(app) as c:
        assert (await c.post("/v1/completions", headers={"x-api-key": "a"}, content=b"{}")).status_code == 200
        assert (await c.post("/v1/completions", headers={"x-api-key": "a"}, content=b"{}")).status_code == 429
        assert (await c.post("/v1/completions", headers={"x-api-key": "b"}, content=b"{}")).status_code == 200


def test_memory_buckets_forget_least_recent_keys() -> None:
    b = MemoryBuckets(FakeClock(), max_keys=2)
    for k in ("a", "b", "c"):
        assert b.take_now(k, 1, Rate(1)) == 0.0
    assert b.take_now("a", 1, Rate(1)) == 0.0  # "a" was dropped, so it starts full again
    assert b.take_now("c", 1, Rate(1)) > 0.0


async def test_admission_queues_then_rejects() -> None:
    adm = Admission(AdmissionLimits(max_concurrent=1, max_queue=1, queue_timeout_s=5))
    assert await adm.acquire()
    waiter = asyncio.create_task(adm.acquire())
    await asyncio.sleep(0)
    assert adm.queued == 1
    assert not await adm.acquire()  # queue full
    adm.release()
    assert await waiter
    assert adm.active == 1
    adm.release()
    assert adm.active == 0


async def test_admission_times_out_queued_requests() -> None:
    adm = Admission(AdmissionLimits(max_concurrent=1, max_queue=5, queue_timeout_s=0.05))
    assert await adm.acquire()
    assert not await adm.acquire()
    assert adm.queued == 0


async def test_admission_middleware_answers_503_when_full() -> None:
    gate = asyncio.Event()

    async def slow_app(scope: Scope, receive: Receive, send: Send) -> None:
        await gate.wait()
        await ok_app(scope, receive, send)

    app = ErrorLayer(AdmissionMiddleware(slow_app, Admission(AdmissionLimits(max_concurrent=1, max_queue=0))))
    async with _client(app) as c:
        first = asyncio.create_task(c.post("/v1/chat/completions", content=b"{}"))
        await asyncio.sleep(0.05)
        r = await c.post("/v1/chat/completions", content=b"{}")
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
        gate.set()
        assert (await first).status_code == 200
        assert (await c.post("/v1/chat/completions", content=b"{}")).status_code == 200

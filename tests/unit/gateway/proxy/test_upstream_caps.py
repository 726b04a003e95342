"""The upstream connection cap end to end in-process: waiting, shedding with 503 + Retry-After, retrying a
saturated worker's request elsewhere, the cap read from the worker's /load, waiting requests as load."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from gateway.settings import Timeouts, UpstreamLimits
from tests.unit.gateway.fake_worker import FakeWorker, make_app, running
from tests.unit.gateway.gateway_harness import serving, settings_for, until

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}
# long first-byte deadline: only the cap, the queue and the client end a hanging request
SLOW = Timeouts(connect_s=1.0, ttfb_s=20.0, idle_s=5.0)


def _url(worker: FakeWorker, wid: str) -> str:
    return f"{worker.url}#id={wid}"


@asynccontextmanager
async def _hanging(client: httpx.AsyncClient, base: str, worker: FakeWorker) -> AsyncIterator[None]:
    """One request that holds a connection to ``worker`` (it hangs there) until the context ends."""
    seen = len(worker.bodies)
    task = asyncio.create_task(client.post(f"{base}/v1/chat/completions", json=CHAT, timeout=30))
    try:
        await until(lambda: _true(len(worker.bodies) > seen))
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _true(value: bool) -> bool:
    return value


def _assert_shed(resp: httpx.Response) -> None:
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "1"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("server_error", "upstream_saturated")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_full_queue_is_shed_with_503_before_anything_is_forwarded(stream: bool) -> None:
    worker = FakeWorker("a", mode="hang")
    settings = settings_for(
        worker.url, timeouts=SLOW, upstream=UpstreamLimits(max_connections=1, max_waiting=0)
    )
    async with running(worker), serving(settings) as base, httpx.AsyncClient(timeout=10) as client:
        async with _hanging(client, base, worker):
            resp = await client.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": stream})
            assert len(worker.bodies) == 1  # the shed request never reached the worker
        metrics = (await client.get(f"{base}/metrics")).text
    _assert_shed(resp)
    assert 'kvgate_upstream_shed_total{reason="queue_full",worker="127.0.0.1:' in metrics


async def test_a_saturated_workers_request_is_retried_on_another_at_once() -> None:
    busy, free = FakeWorker("busy", mode="hang"), FakeWorker("free")
    settings = settings_for(
        _url(busy, "a"), _url(free, "b"), timeouts=SLOW,
        upstream=UpstreamLimits(max_connections=1, max_waiting=0),
    )  # fmt: skip
    async with running(busy, free), serving(settings) as base, httpx.AsyncClient(timeout=10) as client:
        async with _hanging(client, base, busy):  # round robin: a
            first = await client.post(f"{base}/v1/chat/completions", json=CHAT)  # b
            second = await client.post(f"{base}/v1/chat/completions", json=CHAT)  # a: shed, then b
            assert len(busy.bodies) == 1
        metrics = (await client.get(f"{base}/metrics")).text
    assert [first.status_code, second.status_code] == [200, 200]
    assert second.headers["x-kvgate-worker"] == "b"
    assert 'kvgate_upstream_shed_total{reason="queue_full",worker="a"} 1.0' in metrics
    assert "kvgate_retries_total{" not in metrics  # a shed is no failure


async def test_every_candidate_saturated_gives_503() -> None:
    a, b = FakeWorker("a", mode="hang"), FakeWorker("b", mode="hang")
    settings = settings_for(
        _url(a, "a"), _url(b, "b"), timeouts=SLOW, upstream=UpstreamLimits(max_connections=1, max_waiting=0)
    )
    async with (
        running(a, b),
        serving(settings) as base,
        httpx.AsyncClient(timeout=10) as client,
        _hanging(client, base, a),
        _hanging(client, base, b),
    ):
        resp = await client.post(f"{base}/v1/chat/completions", json=CHAT)
        assert (len(a.bodies), len(b.bodies)) == (1, 1)
    _assert_shed(resp)


async def test_a_wait_that_runs_out_is_shed_with_503() -> None:
    worker = FakeWorker("a", mode="hang")
    limits = UpstreamLimits(max_connections=1, max_waiting=4, queue_timeout_s=0.2)
    settings = settings_for(worker.url, timeouts=SLOW, upstream=limits)
    async with running(worker), serving(settings) as base, httpx.AsyncClient(timeout=10) as client:
        async with _hanging(client, base, worker):
            resp = await client.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": True})
        metrics = (await client.get(f"{base}/metrics")).text
    _assert_shed(resp)
    assert 'reason="wait_timeout"' in metrics


async def test_a_waiting_request_counts_as_load_and_gets_the_connection() -> None:
    worker = FakeWorker("a", mode="slow_stream", chunks=16)  # 16 x 50 ms
    limits = UpstreamLimits(max_connections=1, max_waiting=4)
    settings = settings_for(_url(worker, "a"), timeouts=SLOW, upstream=limits)
    body = {**CHAT, "stream": True}
    async with running(worker), serving(settings) as base, httpx.AsyncClient(timeout=10) as client:
        first = asyncio.create_task(_stream(client, base, body))
        await until(lambda: _true(len(worker.bodies) == 1))
        second = asyncio.create_task(_stream(client, base, body))
        await until(lambda: _queue_is(client, base, 2 + 1))  # the worker's reported 2, and ours waiting
        rows = (await client.post(f"{base}/admin/route", json=CHAT)).json()["workers"]
        assert rows[0]["inflight"] == 2  # the waiting request holds its share of the worker's load
        statuses = await asyncio.gather(first, second)
    assert statuses == [200, 200]
    assert worker.finished == 2


async def _stream(client: httpx.AsyncClient, base: str, body: dict[str, Any]) -> int:
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
        raw = b"".join([c async for c in resp.aiter_bytes()])
    assert raw.endswith(b"data: [DONE]\n\n")
    return resp.status_code


async def _queue_is(client: httpx.AsyncClient, base: str, depth: int) -> bool:
    rows = (await client.post(f"{base}/admin/route", json=CHAT)).json()["workers"]
    return bool(rows[0]["queue"] == depth)


@asynccontextmanager
async def _advertising(worker: FakeWorker, max_running: int) -> AsyncIterator[FakeWorker]:
    """``worker`` served with a /load that advertises ``max_running`` slots (and 7 running)."""

    @web.middleware
    async def load(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Any:
        if request.path == "/load":
            figures = {"running": 7, "waiting": 0, "kv_usage": 0.0, "max_running": max_running}
            return web.Response(body=orjson.dumps(figures), content_type="application/json")
        return await handler(request)

    app = make_app(worker)
    app.middlewares.append(load)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", worker.port).start()
    try:
        yield worker
    finally:
        await runner.cleanup()


async def test_the_default_cap_is_the_workers_advertised_slots() -> None:
    worker = FakeWorker("a", mode="hang")
    settings = settings_for(worker.url, timeouts=SLOW, upstream=UpstreamLimits(max_waiting=0))  # cap: auto
    async with _advertising(worker, 1), serving(settings) as base, httpx.AsyncClient(timeout=10) as client:
        await until(lambda: _running_is(client, base, 7))  # the probe read /load
        async with _hanging(client, base, worker):
            resp = await client.post(f"{base}/v1/chat/completions", json=CHAT)
    _assert_shed(resp)


async def _running_is(client: httpx.AsyncClient, base: str, running: int) -> bool:
    return bool((await client.get(f"{base}/admin/workers")).json()["workers"][0]["running"] == running)


async def test_a_client_leaving_while_it_waits_leaves_the_queue() -> None:
    worker = FakeWorker("a", mode="hang")
    limits = UpstreamLimits(max_connections=1, max_waiting=1)
    settings = settings_for(_url(worker, "a"), timeouts=SLOW, upstream=limits)
    async with running(worker), serving(settings) as base, httpx.AsyncClient(timeout=10) as client:
        async with _hanging(client, base, worker):
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"{base}/v1/chat/completions", json=CHAT, timeout=0.3)
            await until(lambda: _queue_is(client, base, 2))  # the worker's reported 2; ours left
            rows = (await client.post(f"{base}/admin/route", json=CHAT)).json()["workers"]
            assert rows[0]["inflight"] == 1
            # its place is free: the next one waits (and gives up) instead of being shed
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"{base}/v1/chat/completions", json=CHAT, timeout=0.3)
        metrics = (await client.get(f"{base}/metrics")).text
    assert len(worker.bodies) == 1
    assert "kvgate_upstream_shed_total{" not in metrics

"""Models, health/ready, metrics and the admin surface."""

from __future__ import annotations

import httpx

from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import serving, settings_for, until

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hello"}]}


async def _status_is(client: httpx.AsyncClient, url: str, status: int) -> bool:
    return (await client.get(url)).status_code == status


async def _num_workers_is(client: httpx.AsyncClient, base: str, num: int) -> bool:
    return len((await client.get(f"{base}/admin/workers")).json()["workers"]) == num


async def test_models_are_the_union_and_requests_go_to_serving_workers() -> None:
    a, b = FakeWorker("a", model="m1"), FakeWorker("b", model="m2")
    async with running(a, b), serving(settings_for(a.url, b.url)) as base, httpx.AsyncClient() as client:
        models = (await client.get(f"{base}/v1/models")).json()
        for _ in range(3):
            resp = await client.post(f"{base}/v1/chat/completions", json={**CHAT, "model": "m2"})
            assert resp.headers["x-kvgate-worker"] == f"127.0.0.1:{b.port}"
    assert models["object"] == "list"
    assert sorted(m["id"] for m in models["data"]) == ["m1", "m2"]
    assert a.bodies == []


async def test_health_ready_and_metrics() -> None:
    a = FakeWorker("a", model="m1")
    async with running(a), serving(settings_for(a.url)) as base, httpx.AsyncClient() as client:
        assert (await client.get(f"{base}/health")).status_code == 200
        assert (await client.get(f"{base}/ready")).status_code == 200
        await client.post(f"{base}/v1/chat/completions", json=CHAT)
        metrics = (await client.get(f"{base}/metrics")).text
        a.healthy = False
        await until(lambda: _status_is(client, f"{base}/ready", 503))
        ready = await client.get(f"{base}/ready")
        unavailable = await client.post(f"{base}/v1/chat/completions", json=CHAT)
    assert ready.status_code == 503
    assert ready.json()["error"]["code"] == "no_healthy_worker"
    assert unavailable.status_code == 503
    assert unavailable.json()["error"]["code"] == "no_healthy_worker"
    assert f'kvgate_requests_total{{route="chat",status="200",worker="127.0.0.1:{a.port}"}} 1.0' in metrics
    assert "kvgate_request_duration_seconds_bucket" in metrics
    assert "kvgate_worker_inflight_requests" in metrics


async def test_admin_lists_registers_and_drains_workers() -> None:
    a, b = FakeWorker("a", model="m1"), FakeWorker("b", model="m1")
    async with running(a, b), serving(settings_for(a.url)) as base, httpx.AsyncClient() as client:
        listed = (await client.get(f"{base}/admin/workers")).json()["workers"]
        added = await client.post(f"{base}/admin/workers", json={"url": b.url, "role": "both", "id": "b"})
        duplicate = await client.post(f"{base}/admin/workers", json={"url": b.url, "id": "b"})
        bad_role = await client.post(f"{base}/admin/workers", json={"url": b.url, "role": "chef"})
        drained = await client.delete(f"{base}/admin/workers/127.0.0.1:{a.port}")
        missing = await client.delete(f"{base}/admin/workers/nope")
        await until(lambda: _num_workers_is(client, base, 1))
        resp = await client.post(f"{base}/v1/chat/completions", json=CHAT)
    assert (
        listed[0] | {"url": a.url, "healthy": True, "queue": 2, "cached_blocks": 7, "role": "both"}
        == listed[0]
    )
    assert added.status_code == 201 and added.json()["role"] == "both" and added.json()["healthy"] is True
    assert duplicate.status_code == 409
    assert bad_role.status_code == 400
    assert drained.status_code == 202 and drained.json()["draining"] is True
    assert missing.status_code == 404
    assert resp.headers["x-kvgate-worker"] == "b"


async def test_drain_waits_for_inflight_stream() -> None:
    a = FakeWorker("a", model="m1", mode="slow_stream", chunks=20)
    async with running(a), serving(settings_for(a.url)) as base, httpx.AsyncClient() as client:
        async with client.stream("POST", f"{base}/v1/chat/completions", json={**CHAT, "stream": True}) as s:
            chunks = s.aiter_bytes()
            await anext(chunks)
            await client.delete(f"{base}/admin/workers/127.0.0.1:{a.port}")
            refused = await client.post(f"{base}/v1/chat/completions", json=CHAT)
            rest = b"".join([c async for c in chunks])
        await until(lambda: _num_workers_is(client, base, 0))
    assert refused.status_code == 503
    assert rest.endswith(b"data: [DONE]\n\n")
    assert a.finished == 1


async def test_admin_route_explains_without_forwarding() -> None:
    a, b = FakeWorker("a", model="m1"), FakeWorker("b", model="m1")
    async with running(a, b), serving(settings_for(a.url, b.url)) as base, httpx.AsyncClient() as client:
        resp = await client.post(f"{base}/admin/route", json=CHAT)
        bad = await client.post(f"{base}/admin/route", json={"model": "m1"})
    body = resp.json()
    assert resp.status_code == 200
    assert body["decision"]["worker"] in {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}
    assert {w["id"] for w in body["workers"]} == {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}
    assert all("score" in w and "prefix_hit_tokens" in w for w in body["workers"])
    assert bad.status_code == 400
    assert a.bodies == [] and b.bodies == []


async def test_redis_state_backend_serves_requests(redis_url: str) -> None:
    a = FakeWorker("a", model="m1")
    async with (
        running(a),
        serving(settings_for(a.url, state_url=redis_url)) as base,
        httpx.AsyncClient() as client,
    ):
        resp = await client.post(f"{base}/v1/chat/completions", json=CHAT)
        workers = (await client.get(f"{base}/admin/workers")).json()["workers"]
    assert resp.status_code == 200
    assert workers[0]["inflight"] == 0

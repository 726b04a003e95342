"""Per-engine shaping through the whole in-process gateway: what each worker got, what the client saw."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn

from gateway.app import create_app
from gateway.deps import Deps
from gateway.settings import Settings
from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import settings_for, until

CHAT: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}
STREAM = {**CHAT, "stream": True}


@asynccontextmanager
async def gateway(settings: Settings) -> AsyncIterator[tuple[str, Deps]]:
    """The gateway in this event loop, with its ``Deps`` (to reach the fleet's records)."""
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{settings.port}", app.state.deps
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def _stream(client: httpx.AsyncClient, base: str, body: dict[str, Any]) -> httpx.Response:
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
        await resp.aread()
    return resp


async def test_stream_gets_include_usage_the_client_does_not_see_it_and_reuse_is_learned() -> None:
    async with (
        running(FakeWorker("a")) as (a,),
        gateway(settings_for(f"{a.url}#engine=lmdeploy")) as (base, deps),
        httpx.AsyncClient() as client,
    ):
        record = next(iter(deps.fleet))
        assert record.facts.prefix_reuse is not True  # LMDeploy: prefix caching is off by default
        resp = await _stream(client, base, STREAM)
        asked = await _stream(client, base, {**STREAM, "stream_options": {"include_usage": True}})
    assert a.bodies[0] == {**STREAM, "stream_options": {"include_usage": True}}
    assert resp.content.count(b'"content":"tok') == 3
    assert b'"usage"' not in resp.content
    assert resp.content.endswith(b"data: [DONE]\n\n")
    assert b'"cached_tokens":4' in asked.content  # a client that asked gets its usage chunk
    assert record.facts.prefix_reuse is True  # cached_tokens > 0 reached the engine facts
    assert record.facts.no_affinity_reason is None


async def test_a_retry_reshapes_the_body_for_the_next_workers_engine() -> None:
    bad, good = FakeWorker("bad", mode="503"), FakeWorker("good")
    async with (
        running(bad, good),
        gateway(settings_for(bad.url + "#engine=kvgate", good.url + "#engine=vllm")) as (base, _),
        httpx.AsyncClient() as client,
    ):
        for _ in range(2):
            resp = await _stream(client, base, STREAM)
            assert resp.status_code == 200
            assert b'"usage"' not in resp.content
    assert bad.bodies
    assert all(b == STREAM for b in bad.bodies)  # kvgate's worker: the client's bytes
    assert good.bodies == [{**STREAM, "stream_options": {"include_usage": True}}] * 2


async def test_mii_gets_its_served_model_name_and_kvgate_the_clients_bytes() -> None:
    async with (
        running(FakeWorker("mii"), FakeWorker("kv")) as (mii, kv),
        gateway(settings_for(mii.url + "#engine=mii", kv.url + "#engine=kvgate")) as (base, deps),
        httpx.AsyncClient() as client,
    ):
        for record in deps.fleet:
            record.facts.served_model = "/models/served"
        await until(lambda: _true(all(r.healthy for r in deps.fleet)))
        for stream in (False, True, True, False):  # round robin: each worker gets one of each
            if stream:
                resp = await _stream(client, base, STREAM)
                assert resp.content.endswith(b"data: [DONE]\n\n")
            else:
                assert (await client.post(f"{base}/v1/chat/completions", json=CHAT)).status_code == 200
    # MII never reports streaming usage: nothing injected
    assert sorted(mii.bodies, key=len) == [
        {**CHAT, "model": "/models/served"},
        {**STREAM, "model": "/models/served"},
    ]
    assert sorted(kv.bodies, key=len) == [CHAT, STREAM]


async def _true(value: bool) -> bool:
    return value

"""PD orchestration in-process: the prefill call, the decode call, headers, fallback and load accounting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from aiohttp import web

from gateway.deps import DepsOverrides
from gateway.routing.pd import prefill_body
from policies.api import Decision, Need, RouteRequest, WorkerId, WorkerView
from tests.support.procs import free_port
from tests.unit.gateway.gateway_harness import serving, settings_for

CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": 7,
    "stream_options": {"include_usage": True},
}


@dataclass
class Recorder:
    """A fake worker that records each request's PD header and body."""

    name: str
    status: int = 200
    delay_s: float = 0.0
    port: int = field(default_factory=free_port)
    seen: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.seen.append((request.headers.get("x-kvgate-pd"), body))
        await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return web.Response(status=self.status, body=b'{"error": {"message": "no"}}')
        usage = {"prompt_tokens": 40, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 32}}
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            chunk = {"choices": [{"index": 0, "delta": {"content": f"from {self.name}"}}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        answer = {"choices": [{"index": 0, "message": {"content": f"from {self.name}"}}], "usage": usage}
        return web.json_response(answer)


async def _models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


async def _ok(_request: web.Request) -> web.Response:
    return web.json_response({})


@asynccontextmanager
async def serve(*workers: Recorder) -> AsyncIterator[None]:
    runners = []
    try:
        for w in workers:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", w.completions)
            app.router.add_get("/v1/models", _models)
            app.router.add_get("/health", _ok)
            app.router.add_get("/load", _ok)
            runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", w.port).start()
            runners.append(runner)
        yield
    finally:
        for runner in runners:
            await runner.cleanup()


class FixedPD:
    """Always decode on ``decode`` after prefilling on ``prefill``."""

    name = "fixed_pd"
    needs: frozenset[Need] = frozenset()

    def __init__(self, decode: str, prefill: str) -> None:
        self._decode, self._prefill = WorkerId(decode), WorkerId(prefill)

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        return Decision(worker=self._decode, prefill_worker=self._prefill, reason="test")


async def _post(prefill: Recorder, decode: Recorder, body: dict[str, Any]) -> httpx.Response:
    policy = FixedPD(decode.id, prefill.id)
    settings = settings_for(f"http://{prefill.id}#role=prefill", f"http://{decode.id}#role=decode")
    async with (
        serve(prefill, decode),
        serving(settings, DepsOverrides(policy=policy)) as base,
        httpx.AsyncClient(timeout=10) as client,
    ):
        resp = await client.post(f"{base}/v1/chat/completions", json=body)
        await resp.aread()
        workers = (await client.get(f"{base}/admin/workers")).json()["workers"]
    assert all(w["inflight"] == 0 for w in workers)  # both workers' load was released
    return resp


def test_prefill_body_asks_for_one_unstreamed_token() -> None:
    out = orjson.loads(prefill_body({**CHAT, "stream": True, "n": 2, "max_completion_tokens": 9}))
    assert out == {"model": "m", "messages": CHAT["messages"], "max_tokens": 1, "stream": False}


async def test_non_streaming_request_prefills_then_decodes() -> None:
    prefill, decode = Recorder("prefill"), Recorder("decode")
    resp = await _post(prefill, decode, CHAT)
    assert resp.status_code == 200
    assert resp.headers["x-kvgate-worker"] == decode.id
    assert resp.headers["x-kvgate-prefill-worker"] == prefill.id
    assert prefill.seen == [("prefill", orjson.loads(prefill_body(CHAT)))]
    assert decode.seen == [("decode", CHAT)]
    data = resp.json()
    assert data["choices"][0]["message"]["content"] == "from decode"
    assert data["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 32},
    }


async def test_streaming_request_streams_from_the_decode_worker() -> None:
    prefill, decode = Recorder("prefill"), Recorder("decode")
    resp = await _post(prefill, decode, {**CHAT, "stream": True})
    assert resp.headers["x-kvgate-worker"] == decode.id
    assert resp.headers["x-kvgate-prefill-worker"] == prefill.id
    assert prefill.seen[0][1]["stream"] is False
    assert decode.seen == [("decode", {**CHAT, "stream": True})]
    assert b"from decode" in resp.content and resp.content.endswith(b"data: [DONE]\n\n")


async def test_failed_prefill_falls_back_to_decode_only() -> None:
    prefill, decode = Recorder("prefill", status=500), Recorder("decode")
    resp = await _post(prefill, decode, CHAT)
    assert resp.status_code == 200
    assert resp.headers["x-kvgate-worker"] == decode.id
    assert "x-kvgate-prefill-worker" not in resp.headers
    assert len(prefill.seen) == 1
    assert decode.seen == [(None, CHAT)]  # no PD header: it prefills itself


async def test_slow_prefill_times_out_and_falls_back() -> None:
    prefill, decode = Recorder("prefill", delay_s=5.0), Recorder("decode")
    resp = await _post(prefill, decode, CHAT)  # the harness's first-byte deadline is 2 s
    assert resp.status_code == 200
    assert "x-kvgate-prefill-worker" not in resp.headers
    assert decode.seen == [(None, CHAT)]


async def test_admin_workers_shows_role_pools_under_a_pd_policy() -> None:
    a, b = Recorder("a"), Recorder("b")
    policy = FixedPD(b.id, a.id)
    policy.disaggregates = True  # type: ignore[attr-defined]  # what PD policies declare: pools run
    settings = settings_for(f"http://{a.id}", f"http://{b.id}", role_pools="dwell_s=30")
    async with (
        serve(a, b),
        serving(settings, DepsOverrides(policy=policy)) as base,
        httpx.AsyncClient(timeout=10) as client,
    ):
        workers = (await client.get(f"{base}/admin/workers")).json()["workers"]
    pools = {w["id"]: (w["role"], w["pool"]) for w in workers}
    reason = "both-capable: joined the smaller pool"
    assert pools == {
        a.id: ("decode", {"capable": "both", "pool": "decode", "reason": f"{reason} (decode)", "moves": 0}),
        b.id: (
            "prefill",
            {"capable": "both", "pool": "prefill", "reason": f"{reason} (prefill)", "moves": 0},
        ),
    }


async def test_admin_workers_shows_no_pools_without_pd() -> None:
    a = Recorder("a")
    async with serve(a), serving(settings_for(f"http://{a.id}")) as base, httpx.AsyncClient() as client:
        workers = (await client.get(f"{base}/admin/workers")).json()["workers"]
    assert [(w["role"], w["pool"]) for w in workers] == [("both", None)]

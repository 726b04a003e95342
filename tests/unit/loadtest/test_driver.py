"""The driver's figures against an in-process server with known latencies and usage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from loadtest.driver import DriverConfig, run_load
from loadtest.report import summarize
from loadtest.workloads import Session, WorkRequest

FIRST_S = 0.15
GAP_S = 0.05
CHUNKS = 4


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    usage = {"prompt_tokens": 32, "completion_tokens": CHUNKS, "prompt_tokens_details": {"cached_tokens": 16}}
    headers = {"x-kvgate-worker": "w1", "x-kvgate-prefix-hit": "16"}
    if body.get("messages", [{}])[0].get("content") == "fail":
        return web.json_response({"error": {"message": "boom"}}, status=503)
    await asyncio.sleep(FIRST_S)
    if not body.get("stream"):
        return web.json_response(
            {"choices": [{"message": {"content": "x"}}], "usage": usage}, headers=headers
        )
    resp = web.StreamResponse(headers={"content-type": "text/event-stream", **headers})
    await resp.prepare(request)
    for i in range(CHUNKS):
        if i:
            await asyncio.sleep(GAP_S)
        chunk = {"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def server(port: int) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _sessions(n: int, content: str = "hi") -> list[Session]:
    req = WorkRequest("chat", {"model": "m", "messages": [{"role": "user", "content": content}]})
    return [Session(f"s{i}", (req,)) for i in range(n)]


async def test_streaming_figures_match_the_server(server: str) -> None:
    result = await run_load(_sessions(4), DriverConfig(target=server, concurrency=4, duration_s=20))
    assert len(result.records) == 4
    for rec in result.records:
        assert rec.ok, rec.error
        assert rec.ttft_s is not None and FIRST_S <= rec.ttft_s < FIRST_S + 2.0
        assert len(rec.itl_s) == CHUNKS - 1 and all(g >= GAP_S * 0.8 for g in rec.itl_s)
        assert rec.e2e_s >= FIRST_S + (CHUNKS - 1) * GAP_S
        assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (32, CHUNKS, 16)
        assert rec.worker == "w1" and rec.predicted_hit_tokens == 16
    summary = summarize(result)
    assert summary.hit_rate == pytest.approx(0.5)
    assert summary.imbalance == pytest.approx(1.0)


async def test_non_streaming_and_errors_are_recorded(server: str) -> None:
    sessions = _sessions(2) + _sessions(1, content="fail")
    result = await run_load(sessions, DriverConfig(target=server, stream=False, concurrency=3, duration_s=20))
    errors = [r for r in result.records if not r.ok]
    assert len(errors) == 1 and "503" in (errors[0].error or "")
    assert all(r.ttft_s is not None and r.ttft_s >= FIRST_S for r in result.records if r.ok)


async def test_request_count_bound_is_respected(server: str) -> None:
    result = await run_load(
        _sessions(20), DriverConfig(target=server, concurrency=5, max_requests=7, duration_s=20)
    )
    assert len(result.records) == 7


async def test_open_loop_starts_sessions_at_their_arrival_times(server: str) -> None:
    req = WorkRequest("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    sessions = [Session("a", (req,), arrival_s=0.0), Session("b", (req,), arrival_s=0.4)]
    result = await run_load(sessions, DriverConfig(target=server, duration_s=20))
    starts = sorted(r.start_s for r in result.records)
    assert starts[1] - starts[0] >= 0.35


async def test_deadline_bounds_the_run(server: str) -> None:
    result = await run_load(_sessions(500), DriverConfig(target=server, concurrency=2, duration_s=0.5))
    assert len(result.records) < 20

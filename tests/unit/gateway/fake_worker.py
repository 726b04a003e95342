"""An in-process fake OpenAI worker (aiohttp.web) with switchable failure modes, for gateway unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.support.procs import free_port


@dataclass
class FakeWorker:
    """Behaviour switches and what the worker saw."""

    name: str
    model: str = "fake-model"
    mode: str = "ok"  # ok | 503 | hang | die_mid_stream | stall_mid_stream | slow_stream
    chunks: int = 3
    linger_s: float = 0.0  # pause between a stream's [DONE] and the end of the response
    port: int = field(default_factory=free_port)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    finished: int = 0
    healthy: bool = True
    runner: web.AppRunner | None = None

    async def stop(self) -> None:
        """Stop listening: later connections are refused."""
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _completion(worker: FakeWorker, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"hi from {worker.name}"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
        "echo": {k: v for k, v in body.items() if k not in ("messages", "prompt")},
    }


def _chunk(text: str) -> bytes:
    data = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def _stream(worker: FakeWorker, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    try:
        for i in range(worker.chunks):
            await resp.write(_chunk(f"tok{i} "))
            if worker.mode == "die_mid_stream" and i == 0:
                assert request.transport is not None
                request.transport.abort()
                return resp
            if worker.mode == "stall_mid_stream":
                await asyncio.sleep(3600)
            if worker.mode == "slow_stream":
                await asyncio.sleep(0.05)
        usage = {
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
            "choices": [],
        }
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b"data: " + orjson.dumps(usage) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        if worker.linger_s:
            await asyncio.sleep(worker.linger_s)
        await resp.write_eof()
        worker.finished += 1
    except (asyncio.CancelledError, ConnectionResetError):
        worker.cancelled += 1
        raise
    return resp


def make_app(worker: FakeWorker) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        worker.bodies.append(body)
        if worker.mode == "503":
            return web.Response(
                status=503, body=b'{"error":{"message":"busy"}}', content_type="application/json"
            )
        if worker.mode == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                worker.cancelled += 1
                raise
        if body.get("stream"):
            return await _stream(worker, request, body)
        worker.finished += 1
        return web.Response(body=orjson.dumps(_completion(worker, body)), content_type="application/json")

    async def models(_request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": worker.model, "object": "model", "owned_by": worker.name}]}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=200 if worker.healthy else 503, text="ok")

    async def load(_request: web.Request) -> web.Response:
        data = {"running": 1, "waiting": 2, "kv_usage": 0.25, "cached_blocks": 7}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/load", load)
    return app


@asynccontextmanager
async def running(*workers: FakeWorker) -> AsyncIterator[tuple[FakeWorker, ...]]:
    """Serve each fake worker on a free loopback port for the duration of the context."""
    try:
        for worker in workers:
            worker.runner = web.AppRunner(
                make_app(worker), handle_signals=False, shutdown_timeout=0.1, handler_cancellation=True
            )
            await worker.runner.setup()
            await web.TCPSite(worker.runner, "127.0.0.1", worker.port).start()
        yield workers
    finally:
        for worker in workers:
            await worker.stop()

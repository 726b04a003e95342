"""An in-process fake engine for the routes beyond chat: the Responses API (with stored responses),
embeddings, Anthropic's Messages API and ``/tokenize``, recording every body it saw."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.support.procs import free_port

_IDS = itertools.count()


@dataclass
class OpenAIWorker:
    """Behaviour switches and what the worker saw."""

    name: str
    model: str = "m1"
    mode: str = "ok"  # ok | die_mid_stream
    port: int = field(default_factory=free_port)
    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)
    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def seen(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body in self.bodies if p == path]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _response(worker: OpenAIWorker, body: dict[str, Any], status: str) -> dict[str, Any]:
    return {
        "id": f"resp_{worker.name}_{next(_IDS)}", "object": "response", "status": status, "model": worker.model,
        "previous_response_id": body.get("previous_response_id"),
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": f"hi from {worker.name}", "annotations": []}]}],
        "usage": {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 16}, "output_tokens": 3,
                  "total_tokens": 23},
    }  # fmt: skip


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


async def _stream_response(
    worker: OpenAIWorker, request: web.Request, done: dict[str, Any]
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(
        _event("response.created", {"response": {**done, "status": "in_progress", "usage": None}})
    )
    if worker.mode == "die_mid_stream":
        assert request.transport is not None
        request.transport.abort()
        return resp
    for i in range(3):
        await resp.write(
            _event("response.output_text.delta", {"delta": f"tok{i} ", "sequence_number": i + 1})
        )
    await resp.write(_event("response.completed", {"response": done, "sequence_number": 4}))
    await resp.write_eof()
    return resp


def make_app(worker: OpenAIWorker) -> web.Application:
    async def create(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        worker.bodies.append((request.path, body))
        previous = body.get("previous_response_id")
        if previous is not None and previous not in worker.stored:
            return _error(404, f"Previous response with id '{previous}' not found.", "previous_response_id")
        done = _response(worker, body, "completed")
        if body.get("store", True):
            worker.stored[done["id"]] = done
        if body.get("stream"):
            return await _stream_response(worker, request, done)
        return web.Response(body=orjson.dumps(done), content_type="application/json")

    async def stored(request: web.Request) -> web.Response:
        worker.gets.append(f"{request.method} {request.path_qs}")
        rid = request.match_info["rid"]
        if rid not in worker.stored:
            return _error(404, f"Response with id '{rid}' not found.")
        if request.method == "DELETE":
            del worker.stored[rid]
            return web.json_response({"id": rid, "object": "response.deleted", "deleted": True})
        return web.json_response(worker.stored[rid])

    async def cancel(request: web.Request) -> web.Response:
        worker.gets.append(f"{request.method} {request.path_qs}")
        return _error(400, "Only responses created with background=true can be cancelled.")

    async def input_items(request: web.Request) -> web.Response:
        worker.gets.append(f"{request.method} {request.path_qs}")
        return web.json_response({"object": "list", "data": [], "has_more": False})

    async def embeddings(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        worker.bodies.append((request.path, body))
        data = [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}]
        return web.json_response(
            {"object": "list", "data": data, "model": body["model"], "worker": worker.name}
        )

    async def messages(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        worker.bodies.append((request.path, body))
        if not body.get("stream"):
            return web.json_response({"type": "message", "content": [{"type": "text", "text": worker.name}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        await resp.write(b'event: message_start\ndata: {"type":"message_start"}\n\n')
        if worker.mode == "die_mid_stream":
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        await resp.write_eof()
        return resp

    async def tokenize(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        worker.bodies.append((request.path, body))
        return web.json_response({"tokens": [1, 2, 3], "count": 3, "worker": worker.name})

    async def chat(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        worker.bodies.append((request.path, body))
        reply = {"id": "c", "object": "chat.completion", "model": worker.model, "choices": []}
        return web.json_response(reply)

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": worker.model, "object": "model"}]})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/responses", create)
    app.router.add_route("GET", "/v1/responses/{rid}", stored)
    app.router.add_route("DELETE", "/v1/responses/{rid}", stored)
    app.router.add_post("/v1/responses/{rid}/cancel", cancel)
    app.router.add_get("/v1/responses/{rid}/input_items", input_items)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


@asynccontextmanager
async def running(*workers: OpenAIWorker) -> AsyncIterator[tuple[OpenAIWorker, ...]]:
    """Serve each worker on a free loopback port for the duration of the context."""
    try:
        for worker in workers:
            worker.runner = web.AppRunner(make_app(worker), handle_signals=False, shutdown_timeout=0.1)
            await worker.runner.setup()
            await web.TCPSite(worker.runner, "127.0.0.1", worker.port).start()
        yield workers
    finally:
        for worker in workers:
            await worker.stop()

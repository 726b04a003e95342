"""The HTTP plumbing every fake shares: the two generation routes, request recording and test controls.

``FakeServer`` holds an engine's pieces (the ``FakeEngine``, its ``Formatter``, its request checks).
``generation_routes`` serves ``POST /v1/chat/completions`` and ``/v1/completions`` through them.

Test controls (not part of any engine's surface; the ``/_fake/`` prefix keeps them apart):

- ``GET /_fake/state``: the engine's name and version, requests counted per ``METHOD path``, the last JSON
  body of each generation route (what a gateway actually forwarded), the engine's load and cache figures;
- ``POST /_fake/fault`` ``{"fail_after_tokens": N, "count": C, "broken": bool}``: the next C generations fail
  after N tokens; ``broken`` makes every generation fail; ``unhealthy`` makes ``/health`` answer as the
  engine does when it is unhealthy;
- ``POST /_fake/reset``: empty the prefix cache (KV listeners hear it) and the counters.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kvgate_core.tokenize.request_prompt import Endpoint
from tests.support.engines.core import EngineConfig, FakeEngine
from tests.support.engines.oai_request import BadRequestError, Job, parse_job
from tests.support.engines.oai_response import Formatter, Reply, full_response, json_response, sse_stream

#: A Starlette lifespan (background tasks, sockets).
Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]
#: An engine's own check of a parsed request: a response rejects it, None lets it through.
Check = Callable[[Job], Response | None]


def _no_check(_: Job) -> Response | None:
    return None


@dataclass(slots=True)
class FakeServer:
    """One fake engine's shared state.

    Attributes:
        name: the engine (``sglang``, ``trtllm`` …).
        version: the engine version the fake follows.
        engine: the scheduler and model.
        formatter: the engine's reply shapes.
        token_field: the chat body field carrying token ids (None: the engine takes none).
        default_max_tokens: ``max_tokens`` when the request has none.
        check: the engine's own request checks.
        lora_of: the LoRA (adapter) name a request selects, or None.
        make_id: the id of a new response (default ``chatcmpl-``/``cmpl-`` and random hex).
        pick: the engine that serves a job where the server runs several (SGLang's DP ranks); None: ``engine``.
    """

    name: str
    version: str
    engine: FakeEngine
    formatter: Formatter
    token_field: str | None = None
    default_max_tokens: int = 16
    check: Check = _no_check
    lora_of: Callable[[Job], str | None] = lambda _job: None
    make_id: Callable[[Endpoint], str] = lambda e: openai_id(e)
    pick: Callable[[Job], FakeEngine] | None = None
    paths: Counter[str] = field(default_factory=Counter)
    last_body: dict[str, Any] = field(default_factory=dict)


def openai_id(endpoint: Endpoint) -> str:
    """``chatcmpl-`` or ``cmpl-`` and 24 random hex digits."""
    return ("chatcmpl-" if endpoint is Endpoint.CHAT else "cmpl-") + os.urandom(12).hex()


async def read_json(request: Request) -> object:
    """The request's JSON body. Raises ``BadRequestError``."""
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise BadRequestError("the request body is not valid JSON") from None


async def serve_generation(server: FakeServer, request: Request, endpoint: Endpoint) -> Response:
    fmt = server.formatter
    try:
        body = await read_json(request)
        server.last_body[request.url.path] = body
        job = parse_job(
            body, endpoint, server.engine.bundle,
            default_max_tokens=server.default_max_tokens, token_field=server.token_field,
        )  # fmt: skip
    except BadRequestError as exc:
        return fmt.error_response(400, str(exc))
    rejected = server.check(job)
    if rejected is not None:
        return rejected
    engine = server.engine if server.pick is None else server.pick(job)
    gen = engine.submit(job.gen_request(lora=server.lora_of(job)))
    reply = Reply(job, server.make_id(endpoint), gen)
    if job.stream:
        return StreamingResponse(sse_stream(fmt, reply), media_type="text/event-stream")
    return await full_response(fmt, reply)


def generation_routes(server: FakeServer) -> list[Route]:
    async def chat(request: Request) -> Response:
        return await serve_generation(server, request, Endpoint.CHAT)

    async def completions(request: Request) -> Response:
        return await serve_generation(server, request, Endpoint.COMPLETIONS)

    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]


def control_routes(server: FakeServer) -> list[Route]:
    async def state(_: Request) -> Response:
        stats = server.engine.stats()
        return json_response({
            "engine": server.name, "version": server.version, "paths": dict(server.paths),
            "last_body": server.last_body,
            "stats": {**dataclasses.asdict(stats), "kv_usage": stats.kv_usage},
            "faults": dataclasses.asdict(server.engine.faults),
        })  # fmt: skip

    async def fault(request: Request) -> Response:
        body = await read_json(request)
        faults = server.engine.faults
        if isinstance(body, dict):
            faults.fail_after_tokens = int(body.get("fail_after_tokens", faults.fail_after_tokens))
            faults.count = int(body.get("count", faults.count))
            faults.broken = bool(body.get("broken", faults.broken))
            faults.unhealthy = bool(body.get("unhealthy", faults.unhealthy))
        return json_response(dataclasses.asdict(faults))

    async def reset(_: Request) -> Response:
        server.engine.reset()
        server.paths.clear()
        server.last_body.clear()
        return json_response({"reset": True})

    return [
        Route("/_fake/state", state),
        Route("/_fake/fault", fault, methods=["POST"]),
        Route("/_fake/reset", reset, methods=["POST"]),
    ]


class RecordPaths:
    """ASGI middleware counting every HTTP request as ``METHOD path`` (the test controls excepted)."""

    def __init__(self, app: ASGIApp, server: FakeServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/_fake/"):
            self.server.paths[f"{scope['method']} {scope['path']}"] += 1
        await self.app(scope, receive, send)


def engine_config(
    args: argparse.Namespace, *, block_size: int, prefix_caching: bool = True, partial_blocks: bool = False
) -> EngineConfig:
    """The ``EngineConfig`` from the runner's common flags (``__main__``) and the engine's own cache facts."""
    return EngineConfig(
        model=args.model, block_size=block_size, kv_tokens=args.kv_tokens, max_running=args.max_running,
        prefill_ms_per_token=args.prefill_ms_per_token, decode_ms_per_token=args.decode_ms_per_token,
        slow_factor=args.slow_factor, prefix_caching=prefix_caching, partial_blocks=partial_blocks,
    )  # fmt: skip


async def _not_found(_: Request, __: Exception) -> Response:
    return json_response({"detail": "Not Found"}, 404)  # FastAPI's 404 (SGLang, TRT-LLM, LMDeploy, MII)


def build_app(
    server: FakeServer, routes: list[Route], *, lifespan: Lifespan | None = None, fastapi_404: bool = True
) -> Starlette:
    """The fake's ASGI app: its engine routes, the generation routes, the test controls, path recording."""
    return Starlette(
        routes=[*routes, *generation_routes(server), *control_routes(server)],
        middleware=[Middleware(RecordPaths, server=server)],
        exception_handlers={404: _not_found} if fastapi_404 else {},
        lifespan=lifespan,
    )

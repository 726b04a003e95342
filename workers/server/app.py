"""``create_app``: the worker's ASGI app (Starlette, orjson) over any ``Engine``.

Routes: the OpenAI ones (``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
with ``GET``/``DELETE /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``, ``POST /v1/embeddings``,
``GET /v1/models``), ``GET /health``, and the introspection ones (``GET /load``, ``GET /kv/events``,
``GET /kv/blocks``, ``POST /tokenize``, ``GET /tokenizer``). The engine is started and stopped by the app's
lifespan. The real engine and the simulated one share this surface. An opaque worker
(``introspection=False``, the ``--sim --foreign`` test engine) serves no introspection route, like a
generic OpenAI-compatible engine whose cache and tokenizer a gateway cannot see.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from workers.engine_api import Engine
from workers.server import info_routes as info, responses_routes
from workers.server.embeddings import create_embeddings
from workers.server.errors import error_response
from workers.server.generation import (
    ENDPOINTS,
    WorkerContext,
    chat_completions,
    completions,
    new_context,
    serve_generation,
)
from workers.server.response_store import ResponseStore


class WorkerApp:
    """The ASGI entry: POSTs to the generation routes go straight to their handler, the rest to Starlette."""

    def __init__(self, app: Starlette, ctx: WorkerContext) -> None:
        self.starlette = app
        self._ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = ENDPOINTS.get(scope["path"])
            if endpoint is not None:
                await serve_generation(self._ctx, endpoint, scope, receive, send)
                return
        await self.starlette(scope, receive, send)


def create_app(
    engine: Engine,
    *,
    owned_by: str = "kvgate",
    introspection: bool = True,
    responses: ResponseStore | None = None,
) -> WorkerApp:
    """The worker app serving ``engine`` (tokenizing with ``engine.bundle``).

    Args:
        engine: the engine.
        owned_by: ``owned_by`` of the ``/v1/models`` card (a gateway detects kvgate's workers by it).
        introspection: serve ``/load``, ``/kv/events``, ``/kv/blocks``, ``/tokenize`` and ``/tokenizer``
            (False: they answer 404).
        responses: where finished Responses API objects are kept (default: a ``ResponseStore()``).
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/responses", responses_routes.create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses_routes.retrieve_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses_routes.delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/cancel", responses_routes.cancel_response, methods=["POST"]),
        Route("/v1/embeddings", create_embeddings, methods=["POST"]),
        Route("/v1/models", info.models, methods=["GET"]),
        Route("/health", info.health, methods=["GET"]),
    ]
    if introspection:
        routes += [
            Route("/load", info.load, methods=["GET"]),
            Route("/kv/events", info.kv_events, methods=["GET"]),
            Route("/kv/blocks", info.kv_blocks, methods=["GET"]),
            Route("/tokenize", info.tokenize, methods=["POST"]),
            Route("/tokenizer", info.tokenizer, methods=["GET"]),
        ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},  # type: ignore[dict-item]
    )
    ctx = new_context(engine, owned_by, responses)
    app.state.worker = ctx
    return WorkerApp(app, ctx)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    code = "not_found" if exc.status_code == 404 else None
    return error_response(exc.status_code, str(exc.detail), code=code)

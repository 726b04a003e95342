"""``create_app(settings, deps=None)``: the gateway's ASGI application.

A Starlette app rather than FastAPI: no route here uses dependency injection or request models, and the
completion routes are raw ASGI callables, so FastAPI would only add per-request overhead. The lifespan
opens ``Deps``, probes the fleet once so the first request finds healthy workers, and runs the background
loops in one ``TaskGroup`` until shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.api import admin_routes, health_routes
from gateway.api.errors import http_error_handler, kvgate_error_handler
from gateway.api.openai_routes import CompletionEndpoint, list_models
from gateway.deps import DepsOverrides, open_deps
from gateway.errors import KvgateError
from gateway.observability.loop_lag import watch_loop_lag
from gateway.reload import WorkerSource, reload
from gateway.settings import Settings
from kvgate_core.tokenize.request_prompt import Endpoint

logger = logging.getLogger(__name__)


class GatewayApp(Starlette):
    """Starlette, plus a direct path for the two completion routes.

    Those endpoints answer every error themselves (``CompletionEndpoint``), so the middleware stack and
    route matching would only add per-request cost on the hot path; every other route goes through
    Starlette as usual. Cross-cutting layers (auth, rate limits, tracing) therefore wrap this app from
    outside as plain ASGI middleware (``gateway.security.setup.wrap_app``); one added with
    ``add_middleware`` would not see the completion routes.
    """

    def __init__(self, *, fast_routes: dict[str, CompletionEndpoint], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fast_routes = fast_routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self._fast_routes.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _completion_routes() -> dict[str, CompletionEndpoint]:
    return {
        "/v1/chat/completions": CompletionEndpoint(Endpoint.CHAT),
        "/v1/completions": CompletionEndpoint(Endpoint.COMPLETIONS),
    }


def _routes(fast: dict[str, CompletionEndpoint]) -> list[Route]:
    return [
        *(Route(path, endpoint, methods=["POST"]) for path, endpoint in fast.items()),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health_routes.health, methods=["GET"]),
        Route("/ready", health_routes.ready, methods=["GET"]),
        Route("/metrics", health_routes.metrics, methods=["GET"]),
        Route("/admin/workers", admin_routes.list_workers, methods=["GET"]),
        Route("/admin/workers", admin_routes.register_worker, methods=["POST"]),
        Route("/admin/workers/{worker_id:path}", admin_routes.drain_worker, methods=["DELETE"]),
        Route("/admin/route", admin_routes.explain_route, methods=["POST"]),
        Route("/admin/parity", admin_routes.check_parity_now, methods=["POST"]),
    ]


def create_app(
    settings: Settings, deps: DepsOverrides | None = None, reload_source: WorkerSource | None = None
) -> GatewayApp:
    """Build the gateway app; nothing starts until the ASGI lifespan runs.

    Args:
        settings: validated settings.
        deps: parts to inject instead of building them (tests); the rest is built from ``settings``.
        reload_source: re-reads the worker list on SIGHUP (``gateway.reload``); None disables reloads.
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_deps(settings, deps) as built:
            app.state.deps = built
            await built.health.round()
            async with asyncio.TaskGroup() as tasks:
                health = tasks.create_task(built.health.run(), name="health-checks")
                lag = tasks.create_task(watch_loop_lag(built.metrics.loop_lag), name="loop-lag")
                if built.pools is not None:
                    pools = tasks.create_task(built.pools.run(), name="role-pools")
                if reload_source is not None:
                    source = reload_source
                    asyncio.get_running_loop().add_signal_handler(
                        signal.SIGHUP, lambda: tasks.create_task(reload(built, source), name="reload")
                    )
                try:
                    yield
                finally:
                    if reload_source is not None:
                        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
                    health.cancel()
                    lag.cancel()
                    if built.pools is not None:
                        pools.cancel()

    fast = _completion_routes()
    return GatewayApp(
        fast_routes=fast,
        routes=_routes(fast),
        lifespan=lifespan,
        exception_handlers={
            KvgateError: kvgate_error_handler,
            HTTPException: http_error_handler,
            Exception: kvgate_error_handler,
        },
    )

"""``GatewayApp``: FastAPI for the control plane, raw ASGI for the two completion routes.

The completion routes are the hot path: ``GatewayApp.__call__`` hands their POSTs straight to
``CompletionEndpoint`` (which answers every error itself), past FastAPI's middleware stack, routing,
dependency injection and models. Everything else (``/admin/*``, ``/health``, ``/ready``, ``/metrics``,
``GET /v1/models``, ``/openapi.json``) is FastAPI with typed models. Cross-cutting layers (auth, rate limits,
tracing) therefore wrap this app from outside as plain ASGI middleware (``gateway.security.setup.wrap_app``);
one added with ``add_middleware`` would not see the completion routes.

The OpenAPI document is generated: FastAPI describes its routes, ``completion_docs`` adds the raw ones.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import Lifespan, Receive, Scope, Send

from gateway.api.admin_routes import admin_router
from gateway.api.catalog_routes import catalog_router
from gateway.api.completion_docs import add_completion_docs
from gateway.api.errors import http_error_handler, kvgate_error_handler, validation_error_handler
from gateway.api.health_routes import health_router
from gateway.api.openai_routes import (
    BalancedEndpoint,
    CompletionEndpoint,
    StoredResponseEndpoint,
    stored_response_route,
)
from gateway.api.ui_routes import ui_router
from gateway.errors import KvgateError
from gateway.openai.routes import BALANCED_ROUTES, MODEL_REQUIRED, RESPONSES_PREFIX
from kvgate_core.asgi import ASGIApp
from kvgate_core.tokenize.request_prompt import Endpoint

TITLE = "kvgate gateway"
DESCRIPTION = (
    "The OpenAI-compatible surface of the kvgate gateway, plus health and admin routes. Unknown fields in "
    "completion bodies are passed through to the worker untouched. Errors use OpenAI's shape."
)


class GatewayApp(FastAPI):
    """FastAPI, plus a direct path for the two completion routes and their entries in the OpenAPI document."""

    def __init__(self, *, fast_routes: dict[str, ASGIApp], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fast_routes = fast_routes
        self._stored = StoredResponseEndpoint()  # one instance per app: it holds no state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if scope["method"] == "POST" and (endpoint := self._fast_routes.get(path)) is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
            if path.startswith(RESPONSES_PREFIX) and stored_response_route(scope["method"], path) is not None:
                scope["app"] = self
                await self._stored(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document of its routes, with the raw completion routes added."""
        document = super().openapi()
        if "/v1/chat/completions" not in document["paths"]:  # FastAPI regenerates it when routes change
            add_completion_docs(document)
        return document


#: the stored-response routes (served by ``GatewayApp.__call__``; these entries answer other methods: 405)
_STORED_PATHS = (
    ("/v1/responses/{response_id}", ["GET", "DELETE"]),
    ("/v1/responses/{response_id}/cancel", ["POST"]),
    ("/v1/responses/{response_id}/input_items", ["GET"]),
)


def build_gateway_app(lifespan: Lifespan[Any] | None = None) -> GatewayApp:
    """The gateway's routes and error handlers; ``lifespan`` opens ``Deps`` (``gateway.app.create_app``)."""
    fast: dict[str, ASGIApp] = {
        "/v1/chat/completions": CompletionEndpoint(Endpoint.CHAT),
        "/v1/completions": CompletionEndpoint(Endpoint.COMPLETIONS),
        "/v1/responses": CompletionEndpoint(Endpoint.RESPONSES),
    }
    for path, route in BALANCED_ROUTES.items():
        fast[path] = BalancedEndpoint(route, require_model=path in MODEL_REQUIRED)
    stored = StoredResponseEndpoint()
    app = GatewayApp(
        fast_routes=fast,
        # The fast path serves their POSTs; these entries answer other methods (405) like any route.
        # completion_docs documents them, so FastAPI must not (it would find no body or response model).
        routes=[
            *(
                Route(path, endpoint, methods=["POST"], include_in_schema=False)
                for path, endpoint in fast.items()
            ),
            *(
                Route(path, stored, methods=methods, include_in_schema=False)
                for path, methods in _STORED_PATHS
            ),
        ],
        lifespan=lifespan,
        title=TITLE,
        version=metadata.version("kvgate"),
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        exception_handlers={
            KvgateError: kvgate_error_handler,
            HTTPException: http_error_handler,
            RequestValidationError: validation_error_handler,
            Exception: kvgate_error_handler,
        },
    )
    for router in (catalog_router(), health_router(), admin_router(), ui_router()):
        app.include_router(router)
    return app

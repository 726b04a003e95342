"""What the FastAPI control-plane routers share: the ``Deps`` dependency, the route class, error docs.

``ControlRoute`` reads a JSON body the way the gateway always has: within ``max_body_bytes`` (413 past
it), parsed with orjson whatever the Content-Type says (``curl -d`` sends form-encoded), and answered with
OpenAI's 400 when it is not a JSON object. FastAPI then validates the body model; its validation errors
become the same 400 (``gateway.api.errors.validation_error_handler``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Message

from gateway.api.models import ErrorResponse
from gateway.api.openai_routes import deps_of, read_body
from gateway.deps import Deps
from gateway.errors import InvalidRequest

Handler = Callable[[Request], Coroutine[Any, Any, Response]]

ERROR_DOC = "OpenAI's error shape"
CLIENT_ERRORS: dict[int | str, dict[str, Any]] = {"4XX": {"model": ErrorResponse, "description": ERROR_DOC}}


def _request_deps(request: Request) -> Deps:
    return deps_of(request.scope)


AppDeps = Annotated[Deps, Depends(_request_deps)]
"""The app's ``Deps`` as a FastAPI dependency (set by the lifespan)."""


def _check_json_object(raw: bytes) -> None:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")


def _as_json(request: Request, raw: bytes) -> Request:
    """``request`` with its body already read and its Content-Type set to JSON."""
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
    scope = {**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}

    async def replay() -> Message:
        return {"type": "http.request", "body": raw, "more_body": False}

    return Request(scope, replay)


class ControlRoute(APIRoute):
    """An ``APIRoute`` whose JSON body (if it has one) is read within the size limit; see the module doc."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def bounded(request: Request) -> Response:
            raw = await read_body(request.receive, deps_of(request.scope).settings.max_body_bytes)
            _check_json_object(raw)
            return await handler(_as_json(request, raw))

        return bounded


def add_get(router: APIRouter, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
    """Register a documented GET route and an undocumented HEAD twin (Starlette routes answered HEAD)."""
    router.add_api_route(path, endpoint, methods=["GET"], **kwargs)
    head = {k: v for k, v in kwargs.items() if k in ("response_model", "response_class", "status_code")}
    router.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False, **head)

"""The OpenAI routes that reach workers (``GET /v1/models`` is in ``catalog_routes``).
Compiled with mypyc (``docs/development.md``: what that rules out).

Plain ASGI callables (no per-request dependency injection, no pydantic): read the body within the size
limit → parse and check once → ``Router.prepare`` → ``Proxy.handle``.

- ``CompletionEndpoint``: chat, completions and the Responses API (cache-aware on the prompt);
- ``BalancedEndpoint``: embeddings and the declared pass-through routes (``gateway.openai.routes``);
- ``StoredResponseEndpoint``: ``/v1/responses/{id}`` and its sub-routes, sent to the worker that stored it.

``gateway.api.completion_docs`` describes them in the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from gateway.api.errors import unexpected
from gateway.errors import (
    BodyTooLarge,
    ClientGone,
    InvalidRequest,
    KvgateError,
    NotFound,
    UnsupportedMediaType,
    send_error,
)
from gateway.openai.routes import RESPONSES_PREFIX
from gateway.openai.schema import ParsedRequest, Route, parse_balanced, parse_request
from gateway.proxy.sticky import response_path
from gateway.proxy.stream import StreamCut
from kvgate_core.asgi import Receive, Send
from kvgate_core.tokenize.request_prompt import Endpoint

if TYPE_CHECKING:
    from gateway.deps import Deps
    from policies.api import RouteRequest


def deps_of(scope: MutableMapping[str, Any]) -> Deps:
    """The app's ``Deps`` (set by the lifespan)."""
    state = scope["app"].state
    # starlette's ``State`` keeps its attributes in the dict ``_state`` and reads them in an interpreted
    # ``__getattr__``; read the dict, and the attribute only where it holds none (its usual error then)
    deps: Deps | None = state._state.get("deps")
    return deps if deps is not None else state.deps


def _check_headers(headers: dict[str, str], limit: int) -> None:
    ctype = headers.get("content-type")
    if ctype is not None and not ctype.lower().startswith("application/json"):
        raise UnsupportedMediaType(f"Content-Type must be application/json (got {ctype!r})")
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise InvalidRequest("invalid Content-Length header")
        if int(length) > limit:
            raise BodyTooLarge(f"the request body exceeds {limit} bytes")


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body: complete only when the server says so (``more_body`` false on an
    ``http.request`` message), whichever server; an ``http.disconnect`` before that voids it.

    Raises:
        BodyTooLarge: it grew past ``limit`` bytes.
        ClientGone: the client left before the body was complete.
    """
    message = await receive()
    if message["type"] != "http.request":
        raise ClientGone("the client disconnected before the request body was complete")
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise BodyTooLarge(f"the request body exceeds {limit} bytes")
        return body
    parts = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone("the client disconnected before the request body was complete")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body exceeds {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _headers(scope: MutableMapping[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


class _Endpoint:
    """The request boundary every route shares: errors become OpenAI's error answer, never a traceback."""

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        try:
            await self.serve(deps_of(scope), scope, receive, send)
        except KvgateError as exc:
            await send_error(send, exc)
        except StreamCut:
            raise  # the server drops the connection: the client sees the stream was cut
        except Exception as exc:  # noqa: BLE001 - request boundary: log it, answer 500, never leak a traceback
            await send_error(send, unexpected(exc))

    async def serve(self, deps: Deps, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        raise NotImplementedError


class _BodyEndpoint(_Endpoint):
    """A route with a JSON body: read within the limit, parsed (``parse``), routed and proxied."""

    async def serve(self, deps: Deps, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        limit = deps.settings.max_body_bytes
        headers = _headers(scope)
        _check_headers(headers, limit)
        raw = await read_body(receive, limit)
        # a large body is parsed and analysed off the loop: one huge prompt stalls nobody
        parsed, req = await deps.offload.analysed(raw, lambda: self.analyse(deps, raw, headers))
        await deps.proxy.handle(parsed, req, raw, receive, send)

    def analyse(self, deps: Deps, raw: bytes, headers: dict[str, str]) -> tuple[ParsedRequest, RouteRequest]:
        parsed = self.parse(deps, raw)
        return parsed, deps.router.prepare(parsed, headers)

    def parse(self, deps: Deps, raw: bytes) -> ParsedRequest:
        raise NotImplementedError


class CompletionEndpoint(_BodyEndpoint):
    """The ASGI app behind one prompt route (chat, completions, the Responses API)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint

    def parse(self, deps: Deps, raw: bytes) -> ParsedRequest:
        return parse_request(raw, self._endpoint, max_tokens_limit=deps.settings.max_tokens_limit)


class BalancedEndpoint(_BodyEndpoint):
    """The ASGI app behind a load-balanced route (``gateway.openai.routes``): embeddings, pass-through."""

    def __init__(self, route: Route, *, require_model: bool) -> None:
        self._route = route
        self._require_model = require_model

    def parse(self, deps: Deps, raw: bytes) -> ParsedRequest:
        parsed = parse_balanced(raw, self._route, require_model=self._require_model)
        if not parsed.model and len({m for r in deps.fleet for m in r.models}) > 1:
            raise InvalidRequest("'model' is required: this gateway serves several models", param="model")
        return parsed


#: the sub-routes of a stored response: (method, suffix after the id)
_STORED_ROUTES = {
    (b"GET", ""), (b"DELETE", ""), (b"POST", "/cancel"), (b"GET", "/input_items"),
}  # fmt: skip


def stored_response_route(method: str, path: str) -> tuple[str, str] | None:
    """``(response id, suffix)`` when ``method path`` is one of the stored-response routes, else None."""
    rest = path[len(RESPONSES_PREFIX) :]
    response_id, _, suffix = rest.partition("/")
    suffix = "/" + suffix if suffix else ""
    if not response_id or (method.encode(), suffix) not in _STORED_ROUTES:
        return None
    return unquote(response_id), suffix


class StoredResponseEndpoint(_Endpoint):
    """``GET|DELETE /v1/responses/{id}``, ``POST …/cancel``, ``GET …/input_items``: to the worker that stored
    the response (``gateway.proxy.sticky``), the answer relayed as it comes (``gateway.proxy.direct``)."""

    async def serve(self, deps: Deps, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        route = stored_response_route(scope["method"], scope["path"])
        if route is None:
            raise NotFound(f"no route {scope['method']} {scope['path']}")
        response_id, suffix = route
        affinity = deps.proxy.affinity
        if affinity is None:
            raise NotFound(f"Response with id '{response_id}' not found.")
        body = b""
        if scope["method"] == "POST":
            body = await read_body(receive, deps.settings.max_body_bytes)
        record = await affinity.owner(response_id)
        path = response_path(response_id) + suffix
        query = scope.get("query_string", b"")
        target = (path + "?" + query.decode("latin-1") if query else path).encode("latin-1")
        status = await deps.proxy.direct.forward(
            record, (scope["method"].encode(), target, body), "responses", receive, send
        )
        if scope["method"] == "DELETE" and status in (200, 404):
            await affinity.forget(response_id)

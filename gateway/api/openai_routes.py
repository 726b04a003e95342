"""``/v1/chat/completions`` and ``/v1/completions`` (``GET /v1/models`` is in ``catalog_routes``).

The two completion routes are plain ASGI callables (no per-request dependency injection, no pydantic):
read the body within the size limit → parse and check once → ``Router.prepare`` → ``Proxy.handle``.
``gateway.api.completion_docs`` describes them in the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from gateway.api.errors import unexpected
from gateway.errors import BodyTooLarge, InvalidRequest, KvgateError, UnsupportedMediaType, send_error
from gateway.openai.schema import parse_request
from kvgate_core.asgi import Receive, Send
from kvgate_core.tokenize.request_prompt import Endpoint

if TYPE_CHECKING:
    from gateway.deps import Deps


def deps_of(scope: MutableMapping[str, Any]) -> Deps:
    """The app's ``Deps`` (set by the lifespan)."""
    deps: Deps = scope["app"].state.deps
    return deps


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
    """The whole request body.

    Raises:
        BodyTooLarge: it grew past ``limit`` bytes.
    """
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise BodyTooLarge(f"the request body exceeds {limit} bytes")
        return body
    parts = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body exceeds {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


class CompletionEndpoint:
    """The ASGI app behind one OpenAI completion route."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        deps = deps_of(scope)
        settings = deps.settings
        try:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            _check_headers(headers, settings.max_body_bytes)
            raw = await read_body(receive, settings.max_body_bytes)
            parsed = parse_request(raw, self._endpoint, max_tokens_limit=settings.max_tokens_limit)
            req = deps.router.prepare(parsed, headers)
            await deps.proxy.handle(parsed, req, raw, receive, send)
        except KvgateError as exc:
            await send_error(send, exc)
        except Exception as exc:  # noqa: BLE001 - request boundary: log it, answer 500, never leak a traceback
            await send_error(send, unexpected(exc))

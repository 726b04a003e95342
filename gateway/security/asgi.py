"""Small ASGI helpers shared by the security middlewares: OpenAI-shaped error replies and header access."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (``name`` lower-case), decoded as latin-1."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def send_error(
    send: Send,
    status: int,
    message: str,
    *,
    type_: str,
    code: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer with OpenAI's error shape ``{"error": {message, type, param, code}}``."""
    body = orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

"""Small ASGI helpers shared by the security middlewares: OpenAI-shaped error replies and header access."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from kvgate_core.asgi import Send


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

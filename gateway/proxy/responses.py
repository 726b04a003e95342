"""ASGI response messages the proxy sends: headers with the ``x-kvgate-*`` annotations, whole bodies.
Compiled with mypyc (``docs/development.md``: what that rules out).
"""

from __future__ import annotations

from kvgate_core.asgi import Send

JSON_TYPE = b"application/json"
SSE_TYPE = b"text/event-stream"


def proxied_headers(
    content_type: bytes, worker: str, prefix_hit: int, length: int | None, prefill: str | None = None
) -> list[tuple[bytes, bytes]]:
    """Response headers for a proxied answer (``prefill``: the PD prefill worker, if one ran)."""
    headers = [
        (b"content-type", content_type),
        (b"x-kvgate-worker", worker.encode()),
        (b"x-kvgate-prefix-hit", str(prefix_hit).encode()),
    ]
    if prefill is not None:
        headers.append((b"x-kvgate-prefill-worker", prefill.encode()))
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    else:
        headers.append((b"cache-control", b"no-cache"))
    return headers


async def send_whole(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """Send a complete response."""
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})

"""In-process access to an engine fake: its ASGI app (lifespan entered) behind an httpx client, and SSE
helpers for reading streamed replies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson

from tests.support.engines.runner import create_app

HELLO = [{"role": "user", "content": "hello there, how are you doing today my friend? " * 2}]


@asynccontextmanager
async def fake(engine: str, *flags: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the fake ``engine`` started with ``flags`` (its lifespan runs around the block)."""
    app = create_app([engine, "--port", "0", *flags])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fake", timeout=10) as client:
            yield client


def chat(model: str = "m", *, stream: bool = False, usage: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": HELLO, "max_tokens": 4, "stream": stream, **extra}
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


def frames(raw: bytes) -> list[bytes]:
    """The SSE events of a body, as raw text between blank lines (comments included)."""
    return [f for f in raw.split(b"\n\n") if f]


def events(raw: bytes) -> list[Any]:
    """The JSON payloads of the ``data:`` events (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for f in frames(raw):
        if f.startswith(b"data: "):
            payload = f[6:].strip()
            out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out

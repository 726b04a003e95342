"""``GET /metrics`` over plain HTTP for Prometheus (the picker has no HTTP app of its own)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from prometheus_client import CONTENT_TYPE_LATEST


def _answer(status: str, body: bytes, content_type: str) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
    return (head + "connection: close\r\n\r\n").encode() + body


async def _handle(
    render: Callable[[], bytes], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        async with asyncio.timeout(10):
            line = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            method, _, rest = line.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            if method == "GET" and path == "/metrics":
                writer.write(_answer("200 OK", render(), CONTENT_TYPE_LATEST))
            elif method == "GET" and path in ("/health", "/ready"):
                writer.write(_answer("200 OK", b"ok\n", "text/plain"))
            else:
                writer.write(_answer("404 Not Found", b"not found\n", "text/plain"))
            await writer.drain()
    except (TimeoutError, OSError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def metrics_server(host: str, port: int, render: Callable[[], bytes]) -> AsyncIterator[asyncio.Server]:
    """Serve ``render()`` on ``http://host:port/metrics`` while the context is open."""
    server = await asyncio.start_server(lambda r, w: _handle(render, r, w), host, port)
    try:
        yield server
    finally:
        server.close()
        await server.wait_closed()

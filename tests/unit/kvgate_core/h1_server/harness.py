"""A ``H1Server`` on a loopback port inside the test's loop, and a raw HTTP/1.1 client to read its bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httptools

from kvgate_core.asgi import ASGIApp
from kvgate_core.h1_server.context import ServerLimits
from kvgate_core.h1_server.server import H1Server

DEADLINE_S = 5.0


@asynccontextmanager
async def running(
    app: ASGIApp, *, limits: ServerLimits | None = None, grace_s: float = 5.0
) -> AsyncIterator[tuple[H1Server, int]]:
    """Serve ``app`` on 127.0.0.1 (a free port) until the block ends; yields the server and its port."""
    server = H1Server(app, grace_s=grace_s, limits=limits)
    task = asyncio.create_task(server.serve("127.0.0.1", 0))
    async with asyncio.timeout(DEADLINE_S):
        while not server.started:
            assert not task.done(), "the server stopped during start-up"
            await asyncio.sleep(0.005)
    try:
        yield server, server.ports[0]
    finally:
        server.request_stop()
        async with asyncio.timeout(DEADLINE_S + 5):
            await task


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    chunked: bool


class _Reader:
    def __init__(self) -> None:
        self.done: list[Response] = []
        self._headers: dict[str, str] = {}
        self._body = b""
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        chunked = self._headers.get("transfer-encoding") == "chunked"
        self.done.append(Response(self.parser.get_status_code(), self._headers, self._body, chunked))
        self._headers, self._body = {}, b""


class Client:
    """One raw connection: write bytes, read whole responses (``head=True`` for answers to HEAD)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._parsed = _Reader()

    @classmethod
    async def connect(cls, port: int) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def responses(self, count: int = 1) -> list[Response]:
        """Read until ``count`` whole responses arrived (bounded by ``DEADLINE_S``)."""
        async with asyncio.timeout(DEADLINE_S):
            while len(self._parsed.done) < count:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError(f"closed after {len(self._parsed.done)} response(s)")
                self._parsed.parser.feed_data(data)
        out, self._parsed.done = self._parsed.done[:count], self._parsed.done[count:]
        return out

    async def raw(self) -> bytes:
        """Everything until the server closes the connection."""
        async with asyncio.timeout(DEADLINE_S):
            return await self.reader.read()

    async def closed_by_server(self) -> bool:
        async with asyncio.timeout(DEADLINE_S):
            return await self.reader.read() == b""

    def close(self) -> None:
        self.writer.close()


def request(method: str = "GET", path: str = "/", body: bytes | None = None, extra: str = "") -> bytes:
    """A request with Content-Length (when ``body`` is given) and ``extra`` header lines."""
    head = f"{method} {path} HTTP/1.1\r\nhost: test\r\n{extra}"
    if body is not None:
        return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body
    return f"{head}\r\n".encode()

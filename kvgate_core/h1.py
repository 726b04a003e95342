"""A minimal keep-alive HTTP/1.1 client for the proxy's POSTs to workers (asyncio protocol + httptools).

Why not aiohttp or httpx here: per proxied request their client machinery costs more CPU than the rest of
the gateway together (``loadtest/bench_proxy.py`` measures it). This client does only what the proxy needs:
one write per request (head and body together), response parsing in C (httptools, chunked decoding
included), pooled connections per worker, and back-pressure for streams. The health checker's frequent
small GETs (``H1Getter``) and the PD prefill calls (``H1Pool.fetch``) use it too; other control-plane
calls keep httpx.

Failures surface as ``UpstreamConnectionError`` (an ``OSError``). A request that fails on a *reused* idle
connection before any response byte is retried once on a fresh connection, because the worker may have
closed it while idle (the keep-alive race); that retry never reaches the failover logic.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

_MAX_BUFFERED_CHUNKS = 64
_MAX_IDLE_PER_HOST = 1024


class UpstreamConnectionError(OSError):
    """The connection failed or closed before the response was complete."""


class H1Connection(asyncio.Protocol):
    """One keep-alive connection; serves one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.content_type = b"application/json"
        self.got_bytes = False
        self.complete = False
        self.closed = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._headers_done: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamConnectionError(f"bad response from worker: {exc}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(UpstreamConnectionError("worker closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        _resolve(self._headers_done)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        if len(self._chunks) > _MAX_BUFFERED_CHUNKS and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        _resolve(self._waiter)

    def on_message_complete(self) -> None:
        self.complete = True
        if not self._parser.should_keep_alive():
            self.abort()
        _resolve(self._headers_done)
        _resolve(self._waiter)

    # client side
    def start(self, request: bytes) -> asyncio.Future[None]:
        """Send a request; the returned future resolves when the response headers arrived."""
        self.status, self.content_type, self.got_bytes, self.complete = 0, b"application/json", False, False
        self._chunks.clear()
        self._headers_done = self._loop.create_future()
        assert self.transport is not None, "connected before use"
        self.transport.write(request)
        return self._headers_done

    async def read_chunk(self) -> bytes:
        """The body bytes received so far (waiting for some); b"" once the response is complete."""
        while not self._chunks:
            if self.complete:
                return b""
            self._waiter = self._loop.create_future()
            await self._waiter
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._drain())
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def read_all(self) -> bytes:
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _drain(self) -> list[bytes]:
        out = list(self._chunks)
        self._chunks.clear()
        return out

    def _fail(self, exc: Exception) -> None:
        for fut in (self._headers_done, self._waiter):
            if fut is not None and not fut.done():
                fut.set_exception(exc)


def _resolve(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class H1Pool:
    """Keep-alive connections per ``host:port``; unbounded in number, at most 1024 idle per host."""

    def __init__(self, *, connect_timeout_s: float) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int, bool], list[H1Connection]] = {}
        self._closed = False

    async def _connect(self, target: Target) -> H1Connection:
        loop = asyncio.get_running_loop()
        factory: Callable[[], H1Connection] = lambda: H1Connection(loop)  # noqa: E731
        host, port = target.host, target.port
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(factory, host, port, ssl=target.tls or None)
        except TimeoutError:
            raise UpstreamConnectionError(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise UpstreamConnectionError(f"connect to {host}:{port} failed: {exc}") from None
        return conn

    async def post(self, target: Target, request: bytes) -> H1Connection:
        """Send a complete request (a POST, or any other built by ``Target``); return the connection once the
        response headers arrived.

        The caller reads the body from the connection, then calls ``release``.

        Raises:
            UpstreamConnectionError: connecting or the exchange failed before the response headers.
        """
        idle = self._idle.get(target.key)
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                await conn.start(request)
                return conn
            except UpstreamConnectionError:
                conn.abort()
                if conn.got_bytes:
                    raise
                # the worker closed it while idle: try a fresh connection
            except BaseException:  # cancelled (a deadline, a client gone): the connection is mid-exchange
                conn.abort()
                raise
        conn = await self._connect(target)
        try:
            await conn.start(request)
        except BaseException:
            conn.abort()
            raise
        return conn

    async def fetch(self, target: Target, request: bytes) -> tuple[int, bytes]:
        """Send a complete request and read its whole response: ``(status, body)``.

        The connection goes back to the pool only when the response was read to its end; on an error or a
        cancellation (the caller's deadline) it is closed. The caller owns the deadline.

        Raises:
            UpstreamConnectionError: connecting or the exchange failed.
        """
        conn = await self.post(target, request)
        try:
            return conn.status, await conn.read_all()
        finally:
            self.release(target, conn)

    def release(self, target: Target, conn: H1Connection) -> None:
        """Return a connection after use: kept when its response completed, else closed."""
        if not conn.complete or conn.closed or self._closed:
            conn.abort()
            return
        idle = self._idle.setdefault(target.key, [])
        if len(idle) < _MAX_IDLE_PER_HOST:
            idle.append(conn)
        else:
            conn.abort()

    def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()


@dataclass(frozen=True, slots=True)
class Target:
    """Where a worker listens, parsed once from its base URL."""

    host: str
    port: int
    tls: bool
    netloc: bytes
    base_path: bytes

    @property
    def key(self) -> tuple[str, int, bool]:
        return (self.host, self.port, self.tls)

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname or "", port, tls, parts.netloc.encode(), parts.path.rstrip("/").encode())

    def post_request(self, path: bytes, body: bytes, extra_headers: bytes = b"") -> bytes:
        """A POST of a JSON body to ``base_path + path`` as one buffer.

        ``extra_headers`` holds complete header lines, each ending in CRLF.
        """
        head = b"POST %s%s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        return head % (self.base_path, path, self.netloc, len(body)) + extra_headers + b"\r\n" + body

    def get_request(self, path: bytes) -> bytes:
        """A GET of ``base_path + path``."""
        return b"GET %s%s HTTP/1.1\r\nhost: %s\r\n\r\n" % (self.base_path, path, self.netloc)


class H1Getter:
    """``await get(base_url, path)`` -> (status, body): small GETs over a keep-alive pool (health probes)."""

    def __init__(self, pool: H1Pool) -> None:
        self._pool = pool

    async def __call__(self, base_url: str, path: str) -> tuple[int, bytes]:
        """Raises ``UpstreamConnectionError`` (an ``OSError``) when the exchange fails."""
        target = Target.parse(base_url)
        return await self._pool.fetch(target, target.get_request(path.encode()))

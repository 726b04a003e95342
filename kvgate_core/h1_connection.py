"""One keep-alive HTTP/1.1 connection to a worker (asyncio protocol + httptools) and the worker's address.

The pool that holds these connections, caps them per worker and queues requests for them is
``kvgate_core.h1``; everything else imports from there.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from kvgate_core.h1_errors import UpstreamConnectionError as UpstreamConnectionError

_MAX_BUFFERED_CHUNKS = 64


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

    @property
    def drained(self) -> bool:
        """True once the response is complete and every body byte was read (``read_chunk`` gives b"")."""
        return self.complete and not self._chunks

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

    def request(self, method: bytes, path: bytes, body: bytes = b"", extra_headers: bytes = b"") -> bytes:
        """Any request to ``base_path + path`` as one buffer; a body (JSON) goes with its length, a GET or
        DELETE without one goes without."""
        head = b"%s %s%s HTTP/1.1\r\nhost: %s\r\n" % (method, self.base_path, path, self.netloc)
        if body or method not in (b"GET", b"HEAD", b"DELETE"):
            head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        return head + extra_headers + b"\r\n" + body

    def get_request(self, path: bytes) -> bytes:
        """A GET of ``base_path + path``."""
        return b"GET %s%s HTTP/1.1\r\nhost: %s\r\n\r\n" % (self.base_path, path, self.netloc)

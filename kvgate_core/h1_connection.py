"""One keep-alive HTTP/1.1 connection to a worker, strict about its framing.
Compiled with mypyc (``docs/development.md``: what that rules out).

``H1Connection`` is an asyncio protocol around httptools' response parser; ``Target`` is a worker's address.
The pool that holds these connections, caps them per worker and queues requests for them is
``kvgate_core.h1``; everything else imports from there.

The client does not trust the worker's framing: a broken or hostile worker must not be able to hand one
client's answer to another, or pass a cut answer off as complete.

- A response ends where its framing says: its Content-Length, its last chunk, or, with neither, the close of
  the connection (RFC 9112 §6.3: read to EOF, and such a connection is not reused). A connection that closes
  before the end (or resets during a body read to EOF) fails the exchange with ``UpstreamConnectionError``,
  for every read after it too.
- Nothing after the end is parsed: a byte that follows a complete response, in the same read or later while
  the connection waits in the pool, closes the connection (the answer already complete stands), so it never
  returns to the pool and no later request takes those bytes for its answer. (Empty lines between messages
  in one read are skipped by llhttp, as RFC 9112 §2.2 allows: they carry nothing.)
- Content-Length with Transfer-Encoding, differing or malformed Content-Lengths (llhttp), a transfer coding
  other than chunked (the client decodes no other), non-HTTP bytes, an unasked 101 and a head over
  ``MAX_HEAD_BYTES`` fail the exchange.
- Interim responses (1xx) are skipped: the answer is the final response that follows. A response to HEAD
  has no body whatever its head says; its connection is closed after it (the parser, which does not know the
  request's method, would read one).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import httptools

from kvgate_core.h1_errors import UpstreamConnectionError as UpstreamConnectionError

logger = logging.getLogger(__name__)

_MAX_BUFFERED_CHUNKS = 64
#: bytes of response head (status lines and header fields, interim responses included) read before the final
#: head completes: more fails the exchange
MAX_HEAD_BYTES: Final = 64 * 1024


class _Stop(Exception):  # noqa: N818 - not an error of its own: stops the parser from a callback
    """Raised in a parser callback to stop the parser where it stands (``H1Connection._reason``: why)."""


class H1Connection(asyncio.Protocol):
    """One keep-alive connection; serves one request at a time (the module docstring says what it accepts)."""

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
        self._aborted = False  # closed by this side
        # the exchange in flight
        self._expecting = False  # a request was sent and its response is not complete: bytes may come
        self._head_request = False  # the request is a HEAD: its response has no body
        self._head_done = False  # the final response's head is complete
        self._head_fed = 0  # bytes read while the final head was incomplete
        self._head_size = 0  # bytes of the header fields parsed (interim responses included)
        self._interim = False  # the message being parsed is an interim (1xx) response
        self._has_length = False  # the message has a Content-Length
        self._coding = b""  # its Transfer-Encoding
        self._until_eof = False  # its body ends when the connection closes
        self._reason = ""  # why a callback stopped the parser
        self._error = ""  # why the exchange failed ("": it did not)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def data_received(self, data: bytes) -> None:
        if not self._expecting:  # idle in the pool, or the response is complete: nothing may follow it
            self._spoil()
            return
        self.got_bytes = True
        if not self._head_done:
            self._head_fed += len(data)
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._rejected(exc)
            return
        if not self._head_done and self._head_fed > MAX_HEAD_BYTES:
            self._fail(f"response head from worker over {MAX_HEAD_BYTES} bytes")
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._expecting:
            return
        if self._until_eof and exc is None and not self._aborted:
            self._finish()  # a body delimited by the close: complete
        elif self._head_done:
            self._fail("worker closed the connection before the response was complete")
        else:
            self._fail("worker closed the connection")

    # httptools callbacks
    def on_message_begin(self) -> None:
        if not self._expecting:  # a second message after the response: stop before a byte of it is read
            self._reason = "after"
            raise _Stop
        self.content_type = b"application/json"
        self._has_length = False
        self._coding = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD_BYTES:
            self._reason = f"response head from worker over {MAX_HEAD_BYTES} bytes"
            raise _Stop
        name = name.lower()
        if name == b"content-type":
            self.content_type = value
        elif name == b"content-length":
            self._has_length = True
        elif name == b"transfer-encoding":
            self._coding = value if not self._coding else b"(more than one)"

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                self._reason = "worker switched protocols (101) unasked"
                raise _Stop
            self._interim = True  # skipped: the final response follows
            return
        coding = self._coding
        if coding and coding.strip().lower() != b"chunked":
            self._reason = f"unsupported transfer coding from worker: {coding.decode('latin-1')!r}"
            raise _Stop
        self.status = status
        self._head_done = True
        if self._head_request:  # no body, whatever the head says: the exchange ends here
            self._finish()
            self.abort()  # the parser would take what follows for the body: never reused
            self._reason = "head"
            raise _Stop
        self._until_eof = not self._has_length and not coding and status != 204 and status != 304
        _resolve(self._headers_done)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        if len(self._chunks) > _MAX_BUFFERED_CHUNKS and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        _resolve(self._waiter)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._finish()
        if not self._parser.should_keep_alive():
            self.abort()

    # client side
    def start(self, request: bytes) -> asyncio.Future[None]:
        """Send a request; the returned future resolves when the (final) response headers arrived."""
        self.status, self.content_type, self.got_bytes, self.complete = 0, b"application/json", False, False
        self._expecting, self._head_request = True, request.startswith(b"HEAD ")
        self._head_done = self._interim = self._until_eof = False
        self._head_fed = self._head_size = 0
        self._error = ""
        self._chunks.clear()
        self._headers_done = self._loop.create_future()
        assert self.transport is not None, "connected before use"
        self.transport.write(request)
        return self._headers_done

    async def read_chunk(self) -> bytes:
        """The body bytes received so far (waiting for some); b"" once the response is complete.

        Raises:
            UpstreamConnectionError: the exchange failed (the connection closed before the response's end, a
                malformed response), now or before this call.
        """
        while not self._chunks:
            if self.complete:
                return b""
            if self._error:
                raise UpstreamConnectionError(self._error)
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
        self._aborted = True
        if self.transport is not None:
            self.transport.abort()

    def _drain(self) -> list[bytes]:
        out = list(self._chunks)
        self._chunks.clear()
        return out

    def _finish(self) -> None:
        """The response is complete: bytes after this spoil the connection."""
        self.complete = True
        self._expecting = False
        _resolve(self._headers_done)
        _resolve(self._waiter)

    def _rejected(self, exc: Exception) -> None:
        """The parser stopped (malformed bytes, or a callback refused what it saw): fail the exchange, or,
        when the response was complete already, keep it and close the connection."""
        reason, self._reason = self._reason, ""
        if self.complete:
            if reason != "head":
                self._spoil()
            return
        self._fail(reason or f"bad response from worker: {exc}")
        self.abort()

    def _spoil(self) -> None:
        """Bytes came after the response (or with no request): close the connection, drop them."""
        logger.warning("worker %s sent bytes after its response: connection closed", self._peer())
        self.abort()

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        if isinstance(peer, tuple) and len(peer) >= 2:
            return f"{peer[0]}:{peer[1]}"
        return "?"

    def _fail(self, message: str) -> None:
        """The exchange failed: every wait on it, now and later, raises (the first reason stands)."""
        if self._error:
            return
        self._error = message
        exc = UpstreamConnectionError(message)
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

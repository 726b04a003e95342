"""One request/response exchange on a server connection: the app's ``receive`` and ``send``.
Compiled with mypyc (``docs/development.md``: what that rules out).

The request body reaches the app through ``receive`` as it arrives (``more_body``); the response head is held
back until the first body message so that a small response leaves in one ``transport.write``, framed by
Content-Length when the app gave none and sent its body whole, else chunked.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any, Protocol

from kvgate_core.asgi import ASGIApp, Message
from kvgate_core.h1_server.wire import CONTINUE_100, NO_BODY_STATUSES, plain_response, status_line

logger = logging.getLogger(__name__)

_NONE, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)
_DISCONNECT: Message = {"type": "http.disconnect"}
_CRLF = re.compile(rb"[\r\n]")


class Link(Protocol):
    """What a cycle needs from its connection (``kvgate_core.h1_server.protocol.HttpProtocol``)."""

    transport: asyncio.Transport
    write_paused: bool
    read_paused: bool

    @property
    def closing(self) -> bool: ...
    def date(self) -> bytes: ...
    async def drain(self) -> None: ...
    def body_consumed(self) -> None: ...
    def response_done(self, cycle: RequestCycle) -> None: ...
    def close(self) -> None: ...


class RequestCycle:
    """The state of one request: its buffered body, its response framing, the client's presence."""

    __slots__ = (
        "_app",
        "_bodyless",
        "_chunks",
        "_delivered",
        "_expect_100",
        "_head",
        "_head_only",
        "_http10",
        "_length",
        "_link",
        "_mode",
        "_on_disconnect",
        "_sent",
        "_waiter",
        "body_complete",
        "buffered",
        "complete",
        "disconnected",
        "keep_alive",
        "scope",
        "started",
    )  # fmt: skip

    def __init__(
        self, app: ASGIApp, link: Link, scope: dict[str, Any], *, keep_alive: bool, expect_100: bool
    ) -> None:
        self.scope = scope
        self.keep_alive = keep_alive
        self.buffered = 0
        self.body_complete = False
        self.disconnected = False
        self.complete = False
        self.started = False
        self._app = app
        self._link = link
        self._chunks: list[bytes] = []
        self._delivered = False
        self._expect_100 = expect_100
        self._head_only = scope["method"] == "HEAD"
        self._http10 = scope["http_version"] == "1.0"
        self._waiter: asyncio.Future[None] | None = None
        self._head: list[bytes] | None = None
        self._bodyless = False
        self._mode = _NONE
        self._length = -1
        self._sent = 0
        self._on_disconnect: Callable[[], None] | None = None

    @property
    def awaiting_continue(self) -> bool:
        """True while the client waits for ``100 Continue`` before it sends the body (and no answer was
        given instead): the body's slowness is then not the client's."""
        return self._expect_100 and not self.complete

    # fed by the connection
    def feed(self, body: bytes) -> None:
        """Body bytes arrived (dropped once the response is done: nobody will read them)."""
        if not self.complete and not self.disconnected:
            self._chunks.append(body)
            self.buffered += len(body)
            self._wake()

    def finish_body(self) -> None:
        """The request's last body byte arrived."""
        self.body_complete = True
        self._wake()

    def disconnect(self) -> None:
        """The client left: ``receive`` answers ``http.disconnect``, ``send`` does nothing from now on, and
        the watcher registered with ``watch_disconnect`` is called."""
        self.disconnected = True
        self._wake()
        callback = self._on_disconnect
        if callback is not None:
            self._on_disconnect = None
            callback()

    def watch_disconnect(self, callback: Callable[[], None] | None) -> bool:
        """Call ``callback`` once when the client leaves (replacing any earlier one; None: stop watching).

        The cheap way to learn of a disconnect (``kvgate_core.asgi.disconnect_watch``): no task waits on
        ``receive``. Returns False, watching nothing, when the client has left already.
        """
        if self.disconnected:
            self._on_disconnect = None
            return False
        self._on_disconnect = callback
        return True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    # the app's side
    async def run(self) -> None:
        """Call the app once: an error before the response starts answers 500, after it closes the link."""
        try:
            await self._app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            if not self.complete:
                self._link.close()
            raise
        except Exception:
            logger.exception("Exception in ASGI application")
            self._fail()
        else:
            if not self.complete and not self.disconnected:
                logger.error("ASGI application returned without completing its response")
                self._fail()

    def _fail(self) -> None:
        if self.complete:
            return
        if self.started or self.disconnected:
            self._link.close()
            return
        self.started = self.complete = True
        self.keep_alive = False
        self._link.transport.write(plain_response(500, "Internal Server Error", self._link.date()))
        self._link.response_done(self)

    async def receive(self) -> Message:
        """The next ``http.request`` part of the body; once all is delivered, wait for ``http.disconnect``."""
        if not self._delivered:
            if not self._chunks and not self.body_complete:
                if self._expect_100:
                    self._expect_100 = False
                    if not self.started and not self.disconnected:
                        self._link.transport.write(CONTINUE_100)
                while not self._chunks and not self.body_complete and not self.disconnected:
                    await self._wait()
            if not self.disconnected:
                chunks = self._chunks
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self.buffered = 0
                if self._link.read_paused:
                    self._link.body_consumed()
                more = not self.body_complete
                self._delivered = not more
                return {"type": "http.request", "body": body, "more_body": more}
        while not self.disconnected and not self.complete:
            await self._wait()
        return _DISCONNECT

    async def send(self, message: Message) -> None:
        """Write ``http.response.start`` / ``http.response.body``; a no-op once the client has left."""
        if self.disconnected:
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("the response was already started")
            self.started = True
            self._start(message["status"], message.get("headers", ()))
            return
        if kind != "http.response.body" or not self.started or self.complete:
            raise RuntimeError(f"unexpected ASGI message {kind!r} at this point of the response")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        data = self._first(body, more) if self._head is not None else self._frame(body, more)
        link = self._link
        if data:
            link.transport.write(data)
        if not more:
            self.complete = True
            self._wake()
            link.response_done(self)
        elif link.write_paused:
            await link.drain()

    def _start(self, status: int, headers: Any) -> None:
        lines: list[bytes] = []
        app_close = False
        for name, value in headers:
            size = len(name)
            # only a name of a framing header's length is lowered and compared (``lower`` is a method call)
            if size == 14 or size == 17 or size == 10:
                lname = name.lower()
                if lname == b"content-length":
                    self._length = int(value)
                    self._mode = _LENGTH
                elif lname == b"transfer-encoding":
                    self._mode = _CHUNKED
                elif lname == b"connection" and value.lower() == b"close":
                    app_close = True
            lines.append(name)
            lines.append(b": ")
            lines.append(value)
            lines.append(b"\r\n")
        block = b"".join(lines)
        # each line has one CR and one LF, its end: none in a name or value (counted once, not per header:
        # ``b"\r" in value`` is slow on bytes, it tries the value as an int first)
        num_lines = len(lines) >> 2
        if block.count(b"\n") != num_lines or block.count(b"\r") != num_lines:
            bad = next(n for n, v in zip(lines[::4], lines[2::4], strict=True) if _CRLF.search(n + v))
            raise RuntimeError(f"invalid response header {bad!r}")
        head = [status_line(status), self._link.date(), block]
        self._bodyless = status in NO_BODY_STATUSES or self._head_only
        if app_close or self._link.closing:
            self.keep_alive = False
        if not self.keep_alive and not app_close:
            head.append(b"connection: close\r\n")
        elif self.keep_alive and self._http10:
            head.append(b"connection: keep-alive\r\n")
        self._head = head

    def _first(self, body: bytes, more: bool) -> bytes:
        head = self._head
        assert head is not None
        self._head = None
        mode = self._mode
        if self._bodyless:  # HEAD or a body-less status: framing headers as the app gave them, no body
            if mode == _NONE and self._head_only and not more:
                head.append(b"content-length: %d\r\n" % len(body))
            self._mode = _NONE
        elif mode == _NONE:
            if not more:
                head.append(b"content-length: %d\r\n" % len(body))
                self._mode, self._length = _LENGTH, len(body)
            elif self._http10:
                self._mode = _UNTIL_CLOSE
                if self.keep_alive:
                    self.keep_alive = False
                    head[-1] = b"connection: close\r\n"
            else:
                head.append(b"transfer-encoding: chunked\r\n")
                self._mode = _CHUNKED
        head.append(b"\r\n")
        head.append(self._frame(body, more))
        return b"".join(head)

    def _frame(self, body: bytes, more: bool) -> bytes:
        mode = self._mode
        if mode == _CHUNKED:
            if more:
                return b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        if mode == _LENGTH:
            self._sent += len(body)
            if self._sent > self._length:
                raise RuntimeError("response body longer than its Content-Length")
            if not more and self._sent < self._length:
                self.keep_alive = False
            return body
        if mode == _UNTIL_CLOSE:
            if not more:
                self.keep_alive = False
            return body
        return b""

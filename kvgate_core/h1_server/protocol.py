"""One client connection of the gateway's HTTP/1.1 server: an asyncio protocol around httptools' parser.

Requests on a keep-alive connection run one at a time: a pipelined request waits (reading paused) until
the response before it is complete. Each request is one ``RequestCycle`` and one app call in its own task.
"""

from __future__ import annotations

import asyncio
import collections
import logging

import httptools

from kvgate_core.h1_server.context import ServerContext
from kvgate_core.h1_server.cycle import RequestCycle
from kvgate_core.h1_server.scope import address, build_scope
from kvgate_core.h1_server.wire import plain_response

logger = logging.getLogger(__name__)


class _HeadTooLargeError(Exception):
    pass


class HttpProtocol(asyncio.Protocol):
    """An HTTP/1.1 server connection (keep-alive, pipelining, flow control both ways)."""

    def __init__(self, ctx: ServerContext, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.write_paused = False
        self.read_paused = False
        self._client: tuple[str, int] | None = None
        self._server: tuple[str, int] | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._expect_100 = False
        self._parsing: RequestCycle | None = None
        self._current: RequestCycle | None = None
        self._queue: collections.deque[RequestCycle] = collections.deque()
        self._drain: asyncio.Future[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # loop time the connection went idle; None: a request runs
        self._closing = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport
        self._client = address(transport.get_extra_info("peername"))
        self._server = address(transport.get_extra_info("sockname"))
        self._ctx.connections.add(self)
        self._set_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._ctx.connections.discard(self)
        self._idle_since = None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        for cycle in (self._current, self._parsing, *self._queue):
            if cycle is not None:
                cycle.disconnect()
        self._queue.clear()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._closing = True  # no protocol switch here: answer the request, then close
            self._stop_reading()
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadTooLargeError):
                self._reject(431, "Request Header Fields Too Large")
            else:
                logger.error("bad request", exc_info=exc.__context__)
                self._reject(400, "Bad Request")
        except httptools.HttpParserError:
            self._reject(400, "Bad Request")

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._cancel_idle_timer()
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._expect_100 = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > self._ctx.limits.max_head_bytes:
            raise _HeadTooLargeError

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        limits = self._ctx.limits
        if self._head_bytes > limits.max_head_bytes or len(self._headers) >= limits.max_headers:
            raise _HeadTooLargeError
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_100 = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        ctx = self._ctx
        scope = build_scope(
            parser.get_method(), self._url, parser.get_http_version(), self._headers,
            self._client, self._server, ctx.lifespan_state,
        )  # fmt: skip
        cycle = RequestCycle(
            ctx.app, self, scope, keep_alive=parser.should_keep_alive(), expect_100=self._expect_100
        )
        self._parsing = cycle
        if self._current is None:
            self._start(cycle)
        else:
            self._queue.append(cycle)
            self._update_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self._parsing
        if cycle is not None:
            cycle.feed(body)
            if cycle.buffered > self._ctx.limits.body_buffer_bytes and not self.read_paused:
                self._update_reading()

    def on_message_complete(self) -> None:
        cycle = self._parsing
        if cycle is not None:
            cycle.finish_body()
            self._parsing = None

    # the cycle's side (kvgate_core.h1_server.cycle.Link)
    @property
    def closing(self) -> bool:
        """True once this connection will close after the response in progress."""
        return self._closing or self._ctx.shutting_down

    def date(self) -> bytes:
        """The current ``date:`` header line."""
        return self._ctx.date.value

    async def drain(self) -> None:
        """Wait until the transport takes writes again (the client reads slower than the app writes)."""
        if self.write_paused and not self._closing:
            self._drain = drain = self._loop.create_future()
            try:
                await drain
            finally:
                self._drain = None

    def body_consumed(self) -> None:
        """The app took the buffered body: maybe resume reading."""
        self._update_reading()

    def response_done(self, cycle: RequestCycle) -> None:
        """``cycle``'s response is complete: close, or run the next pipelined request, or wait idle."""
        self._current = None
        if not cycle.keep_alive or self.closing:
            self.close()
            return
        if self._queue:
            self._start(self._queue.popleft())
        self._update_reading()
        if self._current is None and self._parsing is None:
            self._set_idle_timer()

    def close(self) -> None:
        """Close the connection once what was written is flushed."""
        self._closing = True
        if not self.transport.is_closing():
            self.transport.close()

    def shutdown(self) -> None:
        """The server stops: close now when idle, else after the response in progress."""
        if self._current is None and self._parsing is None:
            self.close()

    # internals
    def _start(self, cycle: RequestCycle) -> None:
        self._current = cycle
        task = self._loop.create_task(cycle.run())
        tasks = self._ctx.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _update_reading(self) -> None:
        parsing = self._parsing
        pause = bool(self._queue) or (
            parsing is not None and parsing.buffered > self._ctx.limits.body_buffer_bytes
        )
        if pause != self.read_paused and not self.transport.is_closing():
            self.read_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _reject(self, status: int, text: str) -> None:
        """Answer ``status`` and close; when a response is under way, close after it instead."""
        self._closing = True
        self._queue.clear()
        current = self._current
        if current is None or (current is self._parsing and not current.started):
            self.transport.write(plain_response(status, text, self._ctx.date.value))
            self.close()
        else:
            self._stop_reading()

    def _stop_reading(self) -> None:
        if not self.read_paused and not self.transport.is_closing():
            self.read_paused = True
            self.transport.pause_reading()

    # The keep-alive timer is armed once and checked when it fires, not cancelled and armed again around
    # every request (a TimerHandle pushed on the loop's heap each time): a busy connection's timer wakes
    # once per keep-alive interval and re-arms.
    def _set_idle_timer(self) -> None:
        self._idle_since = now = self._loop.time()
        if self._idle is None:
            self._idle = self._loop.call_at(now + self._ctx.limits.keep_alive_s, self._idle_check)

    def _cancel_idle_timer(self) -> None:
        self._idle_since = None

    def _idle_check(self) -> None:
        self._idle = None
        if self._closing:
            return
        keep_alive_s = self._ctx.limits.keep_alive_s
        since = self._idle_since
        if since is None:  # a request runs: look again one interval on
            self._idle = self._loop.call_later(keep_alive_s, self._idle_check)
        elif self._loop.time() >= since + keep_alive_s:
            self.close()
        else:
            self._idle = self._loop.call_at(since + keep_alive_s, self._idle_check)

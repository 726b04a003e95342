"""One client connection of the gateway's HTTP/1.1 server: an asyncio protocol around httptools' parser.
Compiled with mypyc (``docs/development.md``: what that rules out).

Requests on a keep-alive connection run one at a time: a pipelined request waits (reading paused) until
the response before it is complete. Each request is one ``RequestCycle`` and one app call in its own task.

Limits hold while bytes arrive, never after they are buffered: head bytes are counted across reads (httptools
buffers an unfinished header line itself), a head must end ``head_timeout_s`` after its first byte, a body
must keep a minimum rate, and an idle keep-alive connection closes. One timer per connection serves all
three deadlines: it is armed once and, when it fires, looks at what the connection is doing and arms itself
for the next deadline (a busy connection does not push a timer on the loop's heap per request).
"""

from __future__ import annotations

import asyncio
import collections
import logging

import httptools

from kvgate_core.h1_server.context import ServerContext, ServerLimits
from kvgate_core.h1_server.cycle import RequestCycle
from kvgate_core.h1_server.scope import BadTargetError, address, build_scope
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
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # loop time the timer fires
        # deadlines' clocks (loop times; -1.0: not running)
        self._idle_since = -1.0  # the connection went idle (no request running, none being read)
        self._head_start = -1.0  # the first byte of the head being read arrived
        self._head_seen = 0  # bytes read since then while the head is unfinished
        self._body_start = -1.0  # the body being read started (or resumed after a pause of ours)
        self._body_seen = 0  # body bytes read since ``_body_start``
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
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None
        for cycle in (self._current, self._parsing, *self._queue):
            if cycle is not None:
                cycle.disconnect()
        self._queue.clear()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._head_start >= 0.0:  # an unfinished head: httptools holds its partial line, count it here
            self._head_seen += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._closing = True  # no protocol switch here: answer the request, then close
            self._stop_reading()
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _HeadTooLargeError):
                self._reject(431, "Request Header Fields Too Large")
            elif isinstance(cause, BadTargetError):
                self._reject(400, "Bad Request")
            else:
                logger.error("bad request", exc_info=cause)
                self._reject(400, "Bad Request")
            return
        except httptools.HttpParserError:
            self._reject(400, "Bad Request")
            return
        if self._head_start >= 0.0 and self._head_seen > self._ctx.limits.max_head_bytes:
            self._reject(431, "Request Header Fields Too Large")

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._idle_since = -1.0
        self._head_start = now = self._loop.time()
        self._head_seen = 0
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._expect_100 = False
        deadline = now + self._ctx.limits.head_timeout_s
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)

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
        self._head_start = -1.0
        self._body_start = now = self._loop.time()
        self._body_seen = 0
        deadline = now + ctx.limits.body_timeout_s
        if self._timer_at > deadline:  # the body's deadline comes before the armed one (a short body timeout)
            self._arm(deadline)
        self._parsing = cycle
        if self._current is None:
            self._start(cycle)
        else:
            self._queue.append(cycle)
            self._update_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self._parsing
        self._body_seen += len(body)
        if cycle is not None:
            cycle.feed(body)
            if cycle.buffered > self._ctx.limits.body_buffer_bytes and not self.read_paused:
                self._update_reading()

    def on_message_complete(self) -> None:
        cycle = self._parsing
        self._body_start = -1.0
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
        # ``_current`` is not read back after it is set to None here: mypy would narrow it to None, and the
        # compiled build checks that narrowed type when the next request's ``_start`` has set it again
        queue = self._queue
        following = queue.popleft() if queue and cycle.keep_alive and not self.closing else None
        self._current = following
        if not cycle.keep_alive or self.closing:
            self.close()
            return
        if following is not None:
            self._start(following)
        self._update_reading()
        if following is None and self._parsing is None:
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
        self._head_start = self._body_start = -1.0
        current = self._current
        if current is None or (current is self._parsing and not current.started):
            if current is not None:
                current.disconnect()  # the request is void: the app reads a disconnect, its writes go nowhere
            self.transport.write(plain_response(status, text, self._ctx.date.value))
            self.close()
        else:
            self._stop_reading()

    def _stop_reading(self) -> None:
        if not self.read_paused and not self.transport.is_closing():
            self.read_paused = True
            self.transport.pause_reading()

    # The timer: armed once, and when it fires it checks the deadline of what the connection is doing (head,
    # body, idle) and arms itself for the next one. Only a deadline earlier than the armed one re-arms it
    # sooner (a head starting on a connection whose timer waits for the keep-alive interval).
    def _set_idle_timer(self) -> None:
        self._idle_since = now = self._loop.time()
        if self._timer is None:
            self._arm(now + self._ctx.limits.keep_alive_s)

    def _arm(self, when: float) -> None:
        timer = self._timer
        if timer is not None:
            timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._closing:
            return
        limits = self._ctx.limits
        now = self._loop.time()
        if self._head_start >= 0.0:
            deadline = self._head_start + limits.head_timeout_s
            if now >= deadline:
                self._timed_out("request head")
                return
        elif self._body_start >= 0.0:
            deadline = self._body_deadline(now, limits)
            if now >= deadline:
                self._timed_out("request body")
                return
        elif self._idle_since >= 0.0:
            deadline = self._idle_since + limits.keep_alive_s
            if now >= deadline:
                self.close()
                return
        else:  # a response is under way, nothing is read: look again one keep-alive interval on
            deadline = now + limits.keep_alive_s
        self._arm(deadline)

    def _body_deadline(self, now: float, limits: ServerLimits) -> float:
        """When the body being read is late: ``body_timeout_s`` after it started plus one second per
        ``min_body_rate`` bytes. While reading is held back by the server (the app has not taken the buffered
        body, or a pipelined request waits) or ``100 Continue`` is not sent yet, the clock starts over."""
        parsing = self._parsing
        if self.read_paused or (parsing is not None and parsing.awaiting_continue):
            self._body_start, self._body_seen = now, 0
        return self._body_start + limits.body_timeout_s + self._body_seen / limits.min_body_rate

    def _timed_out(self, part: str) -> None:
        logger.debug("%s from %s too slow: 408 and closed", part, self._client[0] if self._client else "?")
        self._reject(408, "Request Timeout")

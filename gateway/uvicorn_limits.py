"""``--http-server uvicorn`` with the lean server's client limits: uvicorn's httptools protocol, plus head
bytes counted as they arrive, a head deadline and a minimum body rate
(``kvgate_core.h1_server.context.ServerLimits`` has the same fields and meanings).

uvicorn 0.30-0.55 has none of these: its httptools protocol buffers a header line that never ends without
bound, and a connection that sent one byte keeps its task forever (its keep-alive timer is cancelled at the
first byte and armed again only after a response), and a connection that never sends a byte is held forever.
This subclass hooks the parser callbacks uvicorn already has and leaves the rest as uvicorn runs it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from kvgate_core.h1_server.context import ServerLimits

logger = logging.getLogger(__name__)

_431 = b"Request Header Fields Too Large"
_408 = b"Request Timeout"


def _plain(status: int, reason: bytes) -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
    return head % (status, reason, len(reason)) + b"connection: close\r\n\r\n" + reason


def limited_protocol(limits: ServerLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with ``limits`` enforced (``uvicorn.Config(http=...)``)."""

    class LimitedHttpToolsProtocol(_Limited):
        pass

    LimitedHttpToolsProtocol.limits = limits
    return LimitedHttpToolsProtocol


class _Limited(HttpToolsProtocol):
    """See the module docstring; ``limits`` is set on the subclass ``limited_protocol`` makes."""

    limits: ServerLimits = ServerLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_start = -1.0  # loop time the unfinished head's first byte came; -1: no head being read
        self._head_seen = 0
        self._body_start = -1.0  # loop time the body being read started; -1: none being read
        self._body_seen = 0
        self._deadline: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self._head_start >= 0.0:
            self._head_seen += len(data)
        super().data_received(data)
        if self._head_start >= 0.0 and self._head_seen > self.limits.max_head_bytes:
            self._refuse(431, _431)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.keep_alive_s)  # a connection that never sends a byte (uvicorn arms none)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_start = self.loop.time()
        self._head_seen = 0
        self._arm(self.limits.head_timeout_s)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_seen += len(url)

    def on_headers_complete(self) -> None:
        self._head_start = -1.0
        super().on_headers_complete()
        self._body_start = self.loop.time()
        self._body_seen = 0
        self._arm(self.limits.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        self._body_seen += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_start = -1.0
        self._cancel()
        super().on_message_complete()

    def _arm(self, delay: float) -> None:
        self._cancel()
        self._deadline = self.loop.call_later(delay, self._check)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _check(self) -> None:
        self._deadline = None
        if self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        limits = self.limits
        if self._head_start >= 0.0:
            due = self._head_start + limits.head_timeout_s
        elif self._body_start >= 0.0:
            cycle = self.cycle
            if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
                self._body_start, self._body_seen = now, 0  # held back by us, not by the client
            due = self._body_start + limits.body_timeout_s + self._body_seen / limits.min_body_rate
        elif self._no_request_yet():  # connected, never a byte: closed one keep-alive interval on
            self.transport.close()
            return
        else:
            return
        if now >= due:
            self._refuse(408, _408)
        else:
            self._deadline = self.loop.call_at(due, self._check)

    def _no_request_yet(self) -> bool:
        cycle: RequestResponseCycle | None = self.cycle  # uvicorn types it without its None
        return cycle is None

    def _refuse(self, status: int, reason: bytes) -> None:
        """Answer ``status`` and close, unless a response already started (then only close)."""
        self._head_start = self._body_start = -1.0
        self._cancel()
        cycle = self.cycle
        started = cycle is not None and cycle.response_started and not cycle.response_complete
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's request is void: it reads a disconnect
            cycle.message_event.set()
        if not started:
            self.transport.write(_plain(status, reason))
        self.transport.close()

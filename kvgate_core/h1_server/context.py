"""What every connection of one server shares: the app, the lifespan state, limits, the shutdown flag."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvgate_core.asgi import ASGIApp
from kvgate_core.h1_server.wire import DateHeader


class Connection(Protocol):
    """What the server needs of an open connection (``kvgate_core.h1_server.protocol.HttpProtocol``)."""

    transport: Any

    def shutdown(self) -> None:
        """Close now when idle, else after the response in progress."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Per-connection limits.

    Attributes:
        keep_alive_s: an idle keep-alive connection is closed after this long.
        max_head_bytes: request line + headers larger than this are answered 431 and the connection closed,
            counted as the bytes arrive (a line that never ends is refused once it passes the limit).
        max_headers: more request headers than this: 431.
        body_buffer_bytes: reading pauses while more request body than this waits for the app.
        head_timeout_s: a request's head must be complete this long after its first byte, else 408 and the
            connection closes (nginx's ``client_header_timeout``, Envoy's ``request_headers_timeout``).
        body_timeout_s, min_body_rate: a request body must arrive within ``body_timeout_s`` plus one second
            per ``min_body_rate`` bytes received (a slow trickle is cut, a large upload at a sane rate is
            not), else 408 and the connection closes; the clock stops while the server itself holds reading
            back (the app has not taken what is buffered) or waits to send ``100 Continue``.
    """

    keep_alive_s: float = 30.0
    max_head_bytes: int = 64 * 1024
    max_headers: int = 256
    body_buffer_bytes: int = 256 * 1024
    head_timeout_s: float = 20.0
    body_timeout_s: float = 30.0
    min_body_rate: float = 1024.0

    def __post_init__(self) -> None:
        if min(self.keep_alive_s, self.head_timeout_s, self.body_timeout_s, self.min_body_rate) <= 0:
            raise ValueError("server timeouts and the minimum body rate must be positive")


@dataclass(slots=True)
class ServerContext:
    """The server's shared state, handed to each connection it accepts."""

    app: ASGIApp
    limits: ServerLimits = ServerLimits()
    lifespan_state: dict[str, Any] = field(default_factory=dict)
    date: DateHeader = field(default_factory=DateHeader)
    connections: set[Connection] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # the app calls in progress
    shutting_down: bool = False

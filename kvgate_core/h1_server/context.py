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
        max_head_bytes: request line + headers larger than this are answered 431 and the connection closed.
        max_headers: more request headers than this: 431.
        body_buffer_bytes: reading pauses while more request body than this waits for the app.
    """

    keep_alive_s: float = 30.0
    max_head_bytes: int = 64 * 1024
    max_headers: int = 256
    body_buffer_bytes: int = 256 * 1024


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

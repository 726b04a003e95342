"""What a gateway process started by ``--processes N`` (``gateway.processes``) does differently from a lone
gateway: it binds the shared port with ``SO_REUSEPORT``, labels its log lines and responses with its
index, and tells the parent on a pipe when it serves. Everything else is the ordinary gateway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from typing import Final

from kvgate_core.asgi import ASGIApp, Message, Receive, Scope, Send

#: response header naming the gateway process that served a request (only with ``--processes`` > 1)
PROCESS_HEADER: Final = b"x-kvgate-process"


@dataclass(frozen=True, slots=True)
class ChildRole:
    """This process's place under a supervisor: its index and the pipe to report readiness on."""

    index: int
    ready_fd: int | None = None

    def report_ready(self) -> None:
        """Tell the parent this process serves (once; later calls do nothing)."""
        if self.ready_fd is None:
            return
        with contextlib.suppress(OSError):  # the parent gone or no longer waiting: nothing to tell
            os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT``: the kernel balances new connections
    over every process bound so (uvicorn calls ``listen``).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class _ProcessFields(logging.Filter):
    """Adds ``gw_process`` (index) and ``gw_pid`` to every record (JSON logs show them as fields)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self._index = index
        self._pid = os.getpid()

    def filter(self, record: logging.LogRecord) -> bool:
        record.gw_process = self._index
        record.gw_pid = self._pid
        return True


def label_logs(index: int, *, json: bool) -> None:
    """Label what the root logger's handlers write with this process's index and pid."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_ProcessFields(index))
        if not json:
            handler.setFormatter(
                logging.Formatter(
                    "%(asctime)s %(levelname)s [gw%(gw_process)s pid %(gw_pid)s] %(name)s: %(message)s"
                )
            )


def tag_responses(app: ASGIApp, index: int) -> ASGIApp:
    """``app`` with the ``x-kvgate-process`` response header on every HTTP response."""
    header = (PROCESS_HEADER, str(index).encode())

    async def tagged(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await app(scope, receive, send_tagged)

    return tagged

"""Bytes of HTTP/1.1 responses: precomputed status lines, the cached Date header, canned error answers.
Compiled with mypyc (``docs/development.md``: what that rules out).
"""

from __future__ import annotations

import asyncio
import http
from email.utils import formatdate


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {code} {phrase}\r\n".encode("latin-1")


#: ``HTTP/1.1 <code> <phrase>\r\n`` for every registered status (read-only)
_STATUS_LINES: dict[int, bytes] = {s.value: _status_line(s.value) for s in http.HTTPStatus}

#: statuses whose responses carry no body (and so no framing headers)
NO_BODY_STATUSES = frozenset({204, 304, *range(100, 200)})

CONTINUE_100 = b"HTTP/1.1 100 Continue\r\n\r\n"


def status_line(code: int) -> bytes:
    """The status line for ``code`` (precomputed for the registered ones)."""
    line = _STATUS_LINES.get(code)
    return line if line is not None else _status_line(code)


def plain_response(code: int, text: str, date: bytes) -> bytes:
    """A whole ``text/plain`` response that closes the connection (400, 431, 500)."""
    body = text.encode("utf-8")
    return b"".join((
        status_line(code), date, b"content-type: text/plain; charset=utf-8\r\n",
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body), body,
    ))  # fmt: skip


class DateHeader:
    """``date: <IMF-fixdate>\\r\\n``, refreshed once a second by the server's loop (not per request)."""

    def __init__(self) -> None:
        self.value = self._now()
        self._timer: asyncio.TimerHandle | None = None

    @staticmethod
    def _now() -> bytes:
        return b"date: %s\r\n" % formatdate(usegmt=True).encode("ascii")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Keep ``value`` current while ``loop`` runs (until ``stop``)."""
        self.value = self._now()
        self._timer = loop.call_later(1.0, self.start, loop)

    def stop(self) -> None:
        """Stop refreshing."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

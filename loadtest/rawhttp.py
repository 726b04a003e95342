"""A minimal HTTP/1.1 client on raw asyncio streams, cheap enough for 10,000 concurrent streams at once.

One connection per request (``connection: close``), the body read by ``content-length``, chunked encoding or
to EOF; an event stream is scanned as it arrives (``loadtest.outcomes.SseScan``) and never kept. Every call
ends in an ``Outcome`` and never raises for HTTP, socket or protocol errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadtest.outcomes import Kind, Outcome, SseScan, classify_error_status, classify_json, classify_stream


@dataclass(frozen=True, slots=True)
class Target:
    """Where to send: a host and port (``from_url`` takes ``http://HOST:PORT``)."""

    host: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> Target:
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        return cls(host, int(port))


@dataclass(frozen=True, slots=True)
class Call:
    """One POST: path, JSON body, and whether the answer is an event stream."""

    path: str
    body: bytes
    stream: bool


@dataclass(slots=True)
class OpenGauge:
    """Connections open right now and the most seen at once (one event loop, so plain ints)."""

    open: int = 0
    peak: int = 0

    def up(self) -> None:
        self.open += 1
        self.peak = max(self.peak, self.open)

    def down(self) -> None:
        self.open -= 1


@dataclass(slots=True)
class _Seen:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    ttfb_s: float | None = None
    body: bytearray = field(default_factory=bytearray)
    scan: SseScan = field(default_factory=SseScan)


def request_bytes(target: Target, call: Call) -> bytes:
    """The request's bytes on the wire."""
    head = (
        f"POST {call.path} HTTP/1.1\r\nhost: {target.host}:{target.port}\r\n"
        "content-type: application/json\r\n"
        f"accept: {'text/event-stream' if call.stream else 'application/json'}\r\n"
        f"content-length: {len(call.body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + call.body


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers of a response head (status line up to the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def read_body(
    reader: asyncio.StreamReader, headers: dict[str, str], sink: Callable[[bytes], None]
) -> None:
    """Pass the body to ``sink`` as it arrives; raises ``IncompleteReadError`` if the peer cuts it short."""
    if "content-length" in headers:
        sink(await reader.readexactly(int(headers["content-length"])))
        return
    if "chunked" not in headers.get("transfer-encoding", ""):
        while data := await reader.read(65536):
            sink(data)
        return
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # the end of the (empty) trailer section
            return
        sink((await reader.readexactly(size + 2))[:-2])


async def _exchange(target: Target, call: Call, seen: _Seen, gauge: OpenGauge | None, t0: float) -> None:
    reader, writer = await asyncio.open_connection(target.host, target.port)
    if gauge is not None:
        gauge.up()
    try:
        writer.write(request_bytes(target, call))
        head = await reader.readuntil(b"\r\n\r\n")
        seen.ttfb_s = time.perf_counter() - t0
        seen.status, seen.headers = parse_head(head)
        streaming = call.stream and seen.status == 200
        await read_body(reader, seen.headers, seen.scan.feed if streaming else seen.body.extend)
    finally:
        writer.close()
        if gauge is not None:
            gauge.down()


def _classify(call: Call, seen: _Seen) -> tuple[Kind, str]:
    if seen.status != 200:
        return classify_error_status(seen.status, seen.headers, bytes(seen.body))
    return classify_stream(seen.scan) if call.stream else classify_json(bytes(seen.body))


async def send(target: Target, call: Call, *, timeout_s: float, gauge: OpenGauge | None = None) -> Outcome:
    """Send ``call`` on a new connection and say how it ended (never raises, except on cancellation)."""
    t0 = time.perf_counter()
    seen = _Seen()
    try:
        async with asyncio.timeout(timeout_s):
            await _exchange(target, call, seen, gauge, t0)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        if call.stream and seen.status == 200 and seen.scan.error is not None:
            return Outcome(Kind.CUT, 200, seen.ttfb_s, f"error event, then {type(exc).__name__}")
        stage = "before the response" if seen.ttfb_s is None else f"after HTTP {seen.status}"
        return Outcome(Kind.FAILED, seen.status, seen.ttfb_s, f"{type(exc).__name__} {stage}: {exc}"[:200])
    kind, detail = _classify(call, seen)
    return Outcome(kind, seen.status, seen.ttfb_s, detail)

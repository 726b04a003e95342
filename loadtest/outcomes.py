"""How one request through the gateway ended: ok, shed (503 + ``Retry-After``), failed, or a cut stream.

Pure functions over what a client saw (status, headers, body or the scanned SSE stream), shared by the
concurrency benchmark and the soak so both count the same way:

- **ok**: 200 and, streaming, a ``data: [DONE]`` frame with no error event before it; not streaming, a JSON
  object with ``choices``.
- **shed**: 503 with a ``Retry-After`` header and an OpenAI error body (``{"error": {"message", "type"}}``).
- **cut**: 200 streaming, ended by an OpenAI error event (a worker died mid-stream and the gateway said so).
- **failed**: anything else: another status, a 503 without ``Retry-After`` or the error shape, a connection
  error or timeout, a truncated stream (no ``[DONE]``), a body that is not the expected JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import orjson


class Kind(StrEnum):
    """The four ways a request can end, as counted by the load tools."""

    OK = "ok"
    SHED = "shed"
    FAILED = "failed"
    CUT = "cut"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's end: its kind, HTTP status (0: none), time to the response's first byte, and why."""

    kind: Kind
    status: int = 0
    ttfb_s: float | None = None
    detail: str = ""


class SseScan:
    """Incremental SSE reader: remembers only whether ``[DONE]`` and an error event were seen.

    Bytes may be split anywhere (inside a line, inside a frame); only the unfinished last line is kept, so a
    long stream costs constant memory.
    """

    __slots__ = ("_tail", "data_frames", "done", "error")

    def __init__(self) -> None:
        self._tail = b""
        self.data_frames = 0
        self.done = False
        self.error: str | None = None

    def feed(self, data: bytes) -> None:
        """Consume the next bytes of the event stream."""
        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:") or self.done:
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        self.data_frames += 1
        if self.error is None and payload.startswith(b'{"error"'):
            self.error = _error_message(payload)


def _error_message(payload: bytes) -> str:
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload[:120].decode(errors="replace")
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return f"{err.get('code') or err.get('type')}: {err.get('message')}"
    return str(err)[:120]


def error_shape_ok(body: bytes) -> bool:
    """Whether ``body`` is an OpenAI error object: ``{"error": {"message": str, "type": str, ...}}``."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    err = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and isinstance(err.get("type"), str)


def classify_error_status(status: int, headers: Mapping[str, str], body: bytes) -> tuple[Kind, str]:
    """A non-200 answer: a clean shed (503 + Retry-After + error shape) or a failure, with the reason."""
    if status == 503:
        if "retry-after" not in headers:
            return Kind.FAILED, "503 without Retry-After"
        if not error_shape_ok(body):
            return Kind.FAILED, "503 without an OpenAI error body"
        return Kind.SHED, "503 shed"
    return Kind.FAILED, f"HTTP {status}: {body[:160].decode(errors='replace')}"


def classify_stream(scan: SseScan) -> tuple[Kind, str]:
    """A 200 event stream, once it ended (completely or not)."""
    if scan.error is not None:
        return Kind.CUT, f"error event: {scan.error}"
    if not scan.done:
        return Kind.FAILED, f"truncated stream: no [DONE] after {scan.data_frames} data frames"
    return Kind.OK, ""


def classify_json(body: bytes) -> tuple[Kind, str]:
    """A complete 200 non-streaming answer."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Kind.FAILED, f"not JSON: {body[:120].decode(errors='replace')}"
    if not isinstance(obj, dict) or not obj.get("choices"):
        return Kind.FAILED, f"no choices: {body[:120].decode(errors='replace')}"
    return Kind.OK, ""

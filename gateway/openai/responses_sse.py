"""What the relay reads from a streamed answer that does not end with ``[DONE]``.

A Responses API stream (``event: <type>`` + ``data: {json}`` events, each with a ``type``) opens with
``response.created``, whose ``response.id`` names the response (the gateway records which worker stored it
before the client can see the id), and ends with one terminal event, ``response.completed``,
``response.incomplete`` or ``response.failed``, carrying the whole response with its ``usage``; there is no
``[DONE]``. A stream that ends before a terminal event was cut short. Any other relayed stream (pass-through
routes) ends well when the upstream ends its body cleanly.

``StreamWatch`` follows one stream read by read, holding at most ``_MAX_HEAD`` bytes of its head (until the
id is found) and, after a terminal event starts, that event (up to ``_MAX_TAIL`` bytes, for its usage). A
content read costs one substring search for the terminal marker.
"""

from __future__ import annotations

import re
from typing import Final

import orjson

from gateway.openai.schema import Framing
from gateway.openai.sse import TokenUsage, usage_of

_TERMINALS: Final = (b"response.completed", b"response.incomplete", b"response.failed")
_TERMINAL_PREFIXES: Final = (b"event: ", b"event:", b'"type":"', b'"type": "')
_OVERLAP: Final = 48  # a marker split over two reads is still seen
_MAX_HEAD: Final = 64 * 1024
_MAX_TAIL: Final = 8 * 1024 * 1024


def responses_error_frames(message: str, code: str) -> bytes:
    """An ``error`` event, as the Responses API reports a stream that failed."""
    payload = orjson.dumps(
        {"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0}
    )
    return b"event: error\ndata: " + payload + b"\n\n"


_RESPONSE_ID: Final = re.compile(rb'"response"\s*:\s*\{\s*"id"\s*:\s*"([^"\\]{1,256})"')
_INPUT_TOKENS: Final = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
_CACHED_TOKENS: Final = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_LEADING_ID: Final = re.compile(rb'\A\s*\{\s*"id"\s*:\s*"([^"\\]{1,256})"')


def response_id_of(body: bytes) -> str | None:
    """The ``id`` of a whole Responses API answer: read from its head when it comes first (OpenAI's field
    order, and every engine's), else from the parsed body."""
    match = _LEADING_ID.match(body[:300])
    if match is not None:
        return match.group(1).decode()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    value = data.get("id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _terminal_at(data: bytes) -> int:
    """Where the first terminal event's ``event:`` line or ``"type"`` value starts in ``data``; -1 if none.

    ``bytes.find`` per name (a regex over every read cost ~10 µs per KiB here); a delta that merely quotes a
    terminal type is told apart by what precedes the name.
    """
    for name in _TERMINALS:
        at = data.find(name)
        while at >= 0:
            before = data[max(0, at - 9) : at]
            for prefix in _TERMINAL_PREFIXES:
                if before.endswith(prefix):
                    return at - len(prefix)
            at = data.find(name, at + 1)
    return -1


def _data_of(event: bytes) -> object:
    lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    try:
        return orjson.loads(b"\n".join(lines))
    except orjson.JSONDecodeError:
        return None


class StreamWatch:
    """Follows one relayed stream of ``framing`` (``Framing.RESPONSES`` or ``Framing.EOF``).

    ``feed(read)`` for every read, in order; then ``ended`` says whether the stream finished well so far
    (``EOF`` framing: decided by the caller at the body's end), ``response_id`` is the Responses API id once
    seen, and ``usage()`` the terminal event's usage.
    """

    __slots__ = ("_current", "_head", "_prev", "_seen", "_tail", "ended", "framing", "response_id")

    def __init__(self, framing: Framing) -> None:
        self.framing = framing
        self._head: bytes | None = b"" if framing is Framing.RESPONSES else None
        self._seen = 0  # bytes read while the id is sought
        self._current = bytearray()  # the bytes of the event not finished yet
        self._prev = b""
        self._tail: bytearray | None = None
        self.ended = False
        self.response_id: str | None = None

    def feed(self, read: bytes) -> None:
        if self.framing is not Framing.RESPONSES:
            return
        if self._head is not None:
            self._find_id(read)
        if self._tail is not None:
            if len(self._tail) + len(read) <= _MAX_TAIL:
                self._tail += read
            return
        found = _terminal_at(read)  # the common case: no copy of the read
        shift = 0  # where the searched bytes start, relative to the start of ``read``
        if found < 0 and self._prev:
            found = _terminal_at(self._prev + read[:_OVERLAP])  # a marker split over the two reads
            shift = -len(self._prev)
        if found >= 0:
            self.ended = True
            buf = bytes(self._current) + read
            at = max(0, len(self._current) + shift + found)
            start = buf.rfind(b"\n\n", 0, at)
            self._tail = bytearray(buf[start + 2 if start >= 0 else 0 :])
            return
        cut = read.rfind(b"\n\n")
        if cut >= 0:
            self._current = bytearray(read[cut + 2 :])
        elif len(self._current) + len(read) <= _MAX_TAIL:
            self._current += read
        self._prev = (self._prev + read)[-_OVERLAP:] if len(read) < _OVERLAP else read[-_OVERLAP:]

    def _find_id(self, read: bytes) -> None:
        assert self._head is not None, "only while the id is sought"
        self._seen += len(read)
        head = self._head + read
        end = head.find(b"\n\n")
        while end >= 0:
            quick = _RESPONSE_ID.search(head, 0, end)  # the response object's first field (OpenAI's order)
            if quick is not None:
                self.response_id = quick.group(1).decode()
                self._head = None
                return
            data = _data_of(head[:end])
            response = data.get("response") if isinstance(data, dict) else None
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                self.response_id = response["id"]
                self._head = None
                return
            head = head[end + 2 :]
            end = head.find(b"\n\n")
        # the id comes with the first event (response.created): past the head, stop looking
        self._head = head if self._seen <= _MAX_HEAD else None

    def usage(self) -> TokenUsage | None:
        """The usage of the terminal event (None before one, or without usage)."""
        if self._tail is None:
            return None
        tail = bytes(self._tail)
        at = tail.rfind(b'"usage"')
        if at >= 0:  # read the two figures without parsing the whole response (its output may be long)
            prompt = _INPUT_TOKENS.search(tail, at)
            if prompt is not None:
                cached = _CACHED_TOKENS.search(tail, at)
                return TokenUsage(int(prompt.group(1)), int(cached.group(1)) if cached is not None else None)
        return usage_of(_data_of(tail.replace(b"\r\n", b"\n")))

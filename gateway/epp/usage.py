"""The response's usage as the picker sees it in ``FULL_DUPLEX_STREAMED`` chunks: SSE events one by one,
a whole JSON answer buffered up to a bound."""

from __future__ import annotations

import orjson

from gateway.openai.sse import TokenUsage, usage_in, usage_of


class UsageReader:
    """Reads ``usage`` from a response's body chunks without holding a stream.

    Args:
        streaming: the response is SSE (usage in one event); else JSON, buffered to ``max_bytes``.
        max_bytes: the most of a JSON answer kept to read its usage (beyond it, none is read).
    """

    def __init__(self, *, streaming: bool, max_bytes: int = 4 * 1024 * 1024) -> None:
        self._streaming = streaming
        self._max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._tail = b""
        self.usage: TokenUsage | None = None

    def feed(self, chunk: bytes) -> None:
        """One body chunk, in order."""
        if self._streaming:
            # an event may be split across chunks: read the last unfinished line with the next chunk
            data = self._tail + chunk
            head, sep, self._tail = data.rpartition(b"\n")
            if sep:
                self.usage = usage_in(head + sep) or self.usage
            if len(self._tail) > 65536:
                self._tail = b""
            return
        self._size += len(chunk)
        if self._size <= self._max_bytes:
            self._parts.append(chunk)

    def end(self) -> TokenUsage | None:
        """The usage once the body has ended (None: none was reported)."""
        if not self._streaming and self._size <= self._max_bytes and self._parts:
            try:
                self.usage = usage_of(orjson.loads(b"".join(self._parts)))
            except orjson.JSONDecodeError:
                return None
        elif self._streaming and self._tail:
            self.usage = usage_in(self._tail) or self.usage
        return self.usage

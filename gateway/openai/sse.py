"""SSE on bytes: the frames the gateway writes itself and the little it reads from a relayed stream.
Compiled with mypyc (``docs/development.md``: what that rules out).

The relay copies the worker's bytes; it only looks for the final usage chunk (to learn cached tokens), for
``data: [DONE]`` (a stream that ends without it failed, on most engines) and writes an OpenAI-style error
event when the upstream stream breaks. ``UsageChunkFilter`` drops the usage chunk from a stream whose client
did not ask for it (the gateway asked the engine on its own behalf).

Every reader here takes the shapes engines really send: ``data:{json}`` without the space, ``data: {json} ``
with a trailing one (TensorRT-LLM's first chunk), ``\\r\\n`` line endings, ``: keep-alive`` comment events,
``"id": ""`` (TGI) and chunks without ``object`` / ``created`` (DeepSpeed-MII): none of those fields is read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple, cast

import orjson

DONE_FRAME: Final = b"data: [DONE]\n\n"
_DONE: Final = b"[DONE]"
_USAGE_KEY: Final = b'"usage"'
_EMPTY_LIST: Final = b"[]"
#: the blank line that ends an SSE event, whatever the line endings (``\n\n``, ``\r\n\r\n``, mixed)
_EVENT_END: Final = re.compile(rb"\r?\n\r?\n")
#: ``"usage":`` and its value: ``null`` or an object holding objects at most one level deep
_USAGE_VALUE: Final = re.compile(
    rb'"usage"\s*:\s*(null|\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})'
)  # unrolled: no per-byte branch
#: below this size an answer is parsed whole: orjson reads ~1 KB in about the time the regex path takes
_PARTIAL_FROM: Final = 1024


def error_frames(message: str, code: str, error_type: str = "upstream_error") -> bytes:
    """An error event followed by ``[DONE]``, as OpenAI ends a stream that failed."""
    payload = orjson.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}})
    return b"data: " + payload + b"\n\n" + DONE_FRAME


def ends_stream(chunk: bytes) -> bool:
    """Whether a relayed chunk ends with the ``[DONE]`` frame (``data: [DONE]``, ``data:[DONE]``, any
    trailing whitespace or line endings)."""
    end = chunk.rstrip()
    return end.endswith(_DONE) and end[:-6].rstrip(b" ").endswith(b"data:")


class TokenUsage(NamedTuple):
    """The prompt figures of a response's ``usage``, in the engine's tokens (None: not reported)."""

    prompt_tokens: int | None
    cached_tokens: int | None


#: ``TokenUsage`` built in C (``tuple.__new__``): its generated ``__new__`` is an interpreted frame, one per
#: proxied request
_token_usage: Final = cast(
    "Callable[[tuple[int | None, int | None]], TokenUsage]", functools.partial(tuple.__new__, TokenUsage)
)


def usage_in(chunk: bytes) -> TokenUsage | None:
    """The ``usage`` of the first data line of ``chunk`` that has a usage object, else None (a line split
    across reads is not seen; ``UsageChunkFilter`` reads whole events)."""
    if _USAGE_KEY not in chunk or not _has_usage(chunk):
        return None
    for line in chunk.split(b"\n"):
        if line.startswith(b"data:") and _has_usage(line):
            usage = usage_of(_loads(line[5:]))
            if usage is not None:
                return usage
    return None


def usage_of(data: object) -> TokenUsage | None:
    """The prompt figures of a parsed response's ``usage``: ``prompt_tokens`` and
    ``prompt_tokens_details.cached_tokens`` (chat, completions), or ``input_tokens`` and
    ``input_tokens_details.cached_tokens`` (the Responses API, whose stream events carry the response under
    ``response``); None without a usage object."""
    if not isinstance(data, dict):
        return None
    usage = data.get("usage")
    if usage is None and isinstance(data.get("response"), dict):
        usage = data["response"].get("usage")
    if not isinstance(usage, dict):
        return None
    return _figures(usage)


def _figures(usage: dict[str, Any]) -> TokenUsage:
    """The prompt figures of a ``usage`` object (chat / completions, or the Responses API's names)."""
    if "prompt_tokens" in usage or "input_tokens" not in usage:
        prompt, details = usage.get("prompt_tokens"), usage.get("prompt_tokens_details")
    else:
        prompt, details = usage.get("input_tokens"), usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return _token_usage(
        (prompt if isinstance(prompt, int) else None, cached if isinstance(cached, int) else None)
    )


def usage_in_answer(body: bytes) -> TokenUsage | None:
    """``usage_of`` a whole (non-streamed) JSON answer, parsing only its ``usage`` object where it can.

    Engines write ``usage`` once at the top level, at or near the answer's end; a key inside a string value
    is escaped (``\\"usage\\"``), so the last ``"usage"`` in the bytes is the answer's own. Its value, an
    object whose members nest objects one level deep (``prompt_tokens_details``) or ``null``, is matched
    there by one regex and parsed alone; anything else (deeper nesting, a brace inside a string, a malformed
    value) falls back to parsing the whole answer. The cost no longer grows with the completion's length;
    an answer under 2 KB is parsed whole (as cheap there).
    """
    if len(body) < _PARTIAL_FROM:
        return usage_of(_loads(body))
    at = body.rfind(_USAGE_KEY)
    if at < 0:
        return None
    found = _USAGE_VALUE.match(body, at)
    if found is not None:
        value = found.group(1)
        if value == b"null":
            return None
        usage = _loads(value)
        if isinstance(usage, dict):
            return _figures(usage)
    return usage_of(_loads(body))


def _has_usage(data: bytes) -> bool:
    """An object under ``usage`` (not the ``"usage": null`` some engines put on every chunk)."""
    return b'"usage":{' in data or b'"usage": {' in data


def _loads(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None


def _ends_event(data: bytes) -> bool:
    return data.endswith((b"\n\n", b"\n\r\n"))


def _last_event_end(data: bytes) -> int:
    """The offset just past the last blank line in ``data`` (0 when there is none)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def usage_chunk_of(event: bytes) -> dict[str, Any] | None:
    """The parsed chunk when ``event`` (one SSE event) is a stream's usage chunk: ``"choices": []`` and an
    object ``usage``; else None."""
    if not _has_usage(event) or (b'"choices":[]' not in event and b'"choices": []' not in event):
        return None
    for line in event.splitlines():
        if line.startswith(b"data:"):
            data = _loads(line[5:])
            if isinstance(data, dict) and data.get("choices") == [] and isinstance(data.get("usage"), dict):
                return data
    return None


class UsageChunkFilter:
    """Removes the usage chunk from a relayed stream and keeps its ``usage``.

    ``feed`` returns the bytes to pass on now: everything that arrived, except the usage event and the
    unfinished event at the end of a read (held until the read that completes it: no complete event waits).
    A read that ends on an event boundary without ``[]`` in it (every content chunk) passes through as the
    same bytes object after one suffix check and one scan; only an event with an empty list and a ``usage``
    object is parsed. ``flush`` returns what is held at the stream's end.
    """

    __slots__ = ("_held", "seen", "usage")

    def __init__(self) -> None:
        self._held = b""
        self.usage: TokenUsage | None = None
        self.seen = False  # a usage chunk was dropped

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        self._held = b""
        if not _ends_event(data):
            cut = _last_event_end(data)
            data, self._held = data[:cut], data[cut:]
        if _EMPTY_LIST not in data:
            return data
        return self._without_usage(data)

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return self._without_usage(held) if held else b""

    def _without_usage(self, data: bytes) -> bytes:
        kept: list[bytes] = []
        start = 0
        for match in _EVENT_END.finditer(data):
            self._keep(data[start : match.end()], kept)
            start = match.end()
        if start < len(data):
            self._keep(data[start:], kept)
        return b"".join(kept)

    def _keep(self, event: bytes, kept: list[bytes]) -> None:
        usage = usage_chunk_of(event)
        if usage is None:
            kept.append(event)
        else:
            self.seen = True
            self.usage = usage_of(usage)

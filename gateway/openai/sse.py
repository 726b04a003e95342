"""SSE on bytes: the frames the gateway writes itself and the one thing it reads from a relayed stream.

The relay copies the worker's bytes; it only looks for the final usage chunk (to learn cached tokens) and
writes an OpenAI-style error event when the upstream stream breaks.
"""

from __future__ import annotations

from typing import Final

import orjson

DONE_FRAME: Final = b"data: [DONE]\n\n"
_USAGE_MARK: Final = b'"usage":{'


def error_frames(message: str, code: str, error_type: str = "upstream_error") -> bytes:
    """An error event followed by ``[DONE]``, as OpenAI ends a stream that failed."""
    payload = orjson.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}})
    return b"data: " + payload + b"\n\n" + DONE_FRAME


def ends_stream(chunk: bytes) -> bool:
    """Whether a relayed chunk ends with the ``[DONE]`` frame."""
    return chunk.rstrip().endswith(b"[DONE]")


def cached_tokens_in(chunk: bytes) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` from a chunk holding the usage frame, else None."""
    if _USAGE_MARK not in chunk.replace(b'"usage": {', _USAGE_MARK):
        return None
    for line in chunk.split(b"\n"):
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                data = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return None
            return cached_tokens_of(data)
    return None


def cached_tokens_of(data: object) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of a parsed response, else None."""
    if not isinstance(data, dict):
        return None
    usage = data.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None

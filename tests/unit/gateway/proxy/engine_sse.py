"""SSE bytes as the engines write them (shapes from each engine's source: docs/engines.md), for the relay and SSE tests."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"


def event(data: dict[str, Any], *, sep: bytes = b"data: ", end: bytes = b"\n\n") -> bytes:
    return sep + orjson.dumps(data) + end


def content(text: str, *, chunk_id: str = "chatcmpl-1", **extra: Any) -> dict[str, Any]:
    """A vLLM-like content chunk (``extra`` adds fields, e.g. TGI's ``usage: None``)."""
    return {
        "id": chunk_id, "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}],
        **extra,
    }  # fmt: skip


def usage(cached: int | None, *, chunk_id: str = "chatcmpl-1") -> dict[str, Any]:
    """The final usage chunk: ``choices: []`` and ``usage`` (``cached`` None: no prompt_tokens_details)."""
    report: dict[str, Any] = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    if cached is not None:
        report["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": chunk_id, "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
            "usage": report}  # fmt: skip


def vllm_stream(cached: int = 4, words: int = 3) -> list[bytes]:
    """One event per read; the usage chunk right before [DONE]."""
    return [event(content(f"w{i} ")) for i in range(words)] + [event(usage(cached)), DONE]


def tgi_stream() -> list[bytes]:
    """TGI: ``"id": ""`` everywhere, ``"usage": null`` on content chunks, no cached_tokens, keep-alives."""
    chunks = [event(content(f"w{i} ", chunk_id="", usage=None)) for i in range(3)]
    return [chunks[0], KEEP_ALIVE, *chunks[1:], event(usage(None, chunk_id="")), DONE]


def mii_stream(*, done: bool) -> list[bytes]:
    """MII: no ``object`` / ``created``, a role-only first chunk, no usage, [DONE] or not."""
    role = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    words = [
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
        for i in range(2)
    ]
    return [event(role), *(event(w) for w in words), *([DONE] if done else [])]


def trtllm_stream(cached: int = 2) -> list[bytes]:
    """TensorRT-LLM: the first (role) chunk is written ``data: {json} \\n\\n``."""
    role = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant"}}]}  # fmt: skip
    return [event(role, end=b" \n\n"), event(content("w0 ")), event(usage(cached)), DONE]


def crlf(chunks: list[bytes]) -> list[bytes]:
    """The same events with ``\\r\\n`` line endings and no space after ``data:``."""
    return [c.replace(b"\n", b"\r\n").replace(b"data: ", b"data:") for c in chunks]

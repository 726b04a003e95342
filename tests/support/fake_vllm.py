"""A small server that streams the way vLLM 0.32 does (``vllm/entrypoints/openai/chat_completion/serving.py``; docs/engines.md), for gateway tests.

- ``POST /v1/chat/completions``: a role chunk, one chunk per word, a finish chunk; the usage chunk
  (``"choices": []`` + ``usage`` with ``prompt_tokens_details.cached_tokens``) only when the request has
  ``stream_options.include_usage``, right before ``data: [DONE]``; non-streamed answers carry usage always.
- ``GET /v1/models`` (``owned_by: vllm``), ``/version``, ``/health``; no ``/load``, ``/tokenizer`` or KV events.
- ``GET /_seen``: the ``stream_options`` of every streamed request received (what the gateway sent).

Run: ``python -m tests.support.fake_vllm --port N [--model NAME] [--cached-tokens N]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

WORDS = ("Hello", " from", " a", " vLLM-like", " server.")


def _chunk(model: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
    data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": choices, **extra}  # fmt: skip
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _usage(cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": 100, "total_tokens": 105, "completion_tokens": len(WORDS),
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}  # fmt: skip


async def _events(model: str, include_usage: bool, cached_tokens: int) -> AsyncIterator[bytes]:
    yield _chunk(model, [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    for word in WORDS:
        yield _chunk(model, [{"index": 0, "delta": {"content": word}, "finish_reason": None}])
    yield _chunk(model, [{"index": 0, "delta": {}, "finish_reason": "stop"}])
    if include_usage:
        yield _chunk(model, [], usage=_usage(cached_tokens))
    yield b"data: [DONE]\n\n"


def build_app(model: str, cached_tokens: int) -> Starlette:
    seen: list[Any] = []

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if not body.get("stream"):
            answer = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                      "model": model, "usage": _usage(cached_tokens),
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(WORDS)},
                                   "finish_reason": "stop"}]}  # fmt: skip
            return Response(orjson.dumps(answer), media_type="application/json")
        options = body.get("stream_options")
        seen.append(options)
        include = isinstance(options, dict) and bool(options.get("include_usage"))
        return StreamingResponse(_events(model, include, cached_tokens), media_type="text/event-stream")

    async def models(_: Request) -> Response:
        card = {"id": model, "object": "model", "created": 0, "owned_by": "vllm", "root": model}
        return Response(orjson.dumps({"object": "list", "data": [card]}), media_type="application/json")

    async def version(_: Request) -> Response:
        return Response(b'{"version":"0.32.0"}', media_type="application/json")

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def seen_options(_: Request) -> Response:
        return Response(orjson.dumps(seen), media_type="application/json")

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models),
        Route("/version", version), Route("/health", health), Route("/_seen", seen_options),
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake-vllm")
    parser.add_argument("--cached-tokens", type=int, default=48)
    args = parser.parse_args()
    uvicorn.run(
        build_app(args.model, args.cached_tokens), host="127.0.0.1", port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()

"""A bare OpenAI-compatible server for start-up tests: chat and completions that echo, ``/v1/models`` and
``/health``, and nothing kvgate-specific (no ``/tokenizer``, ``/load`` or KV events), like an engine whose
kind the gateway cannot tell. ``--root DIR`` names a model directory in ``/v1/models`` the way vLLM does.

Run: ``python -m tests.support.plain_openai --port N [--root DIR] [--model NAME]``.
"""

from __future__ import annotations

import argparse
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def build_app(model: str, root: str | None) -> Starlette:
    async def models(_: Request) -> Response:
        card: dict[str, object] = {"id": model, "object": "model", "created": 0, "owned_by": "someone"}
        if root is not None:
            card["root"] = root
        return JSONResponse({"object": "list", "data": [card]})

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def chat(request: Request) -> Response:
        body = await request.json()
        text = str(body["messages"][-1]["content"])[:32]
        return JSONResponse({
            "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })  # fmt: skip

    return Starlette(routes=[
        Route("/v1/models", models), Route("/health", health), Route("/v1/chat/completions", chat, methods=["POST"]),
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="plain-model")
    parser.add_argument("--root", default=None)
    args = parser.parse_args()
    uvicorn.run(build_app(args.model, args.root), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

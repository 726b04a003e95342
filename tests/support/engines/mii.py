"""A fake DeepSpeed-MII OpenAI server (``mii.entrypoints.openai_api_server``), after its own source (the files read: docs/engines.md).

Version: DeepSpeed-MII 0.3.3 (``main`` @ 8abdd98, 2025-07-01; ``mii/entrypoints/{openai_api_server,
data_models}.py``, FastChat-derived).

Reproduces:

- ``GET /v1/models`` (``owned_by: "deepspeed-mii"``, ``root``, ``permission``).
- ``GET /health`` is always 200 ``{"status": "ok"}``, even with ``--broken``, where every generation fails.
- ``model`` must equal ``--model`` exactly: otherwise HTTP 400 ``{"object": "error", "message": "Model … not
  found…", "code": 40301}``; every error is HTTP 400 with that shape (validation: code 40001), e.g. a
  message whose content is not a string.
- Defaults ``max_tokens`` 128; a ``stop`` list keeps its first element.
- Streams: a role-only first chunk (chat), chunks serialized ``exclude_unset`` so they carry **no
  ``object`` and no ``created``** (``id``, ``model``, ``choices`` only; completions chunks keep ``object``),
  **no usage at all** (``include_usage`` is ignored), and no error event: a failure breaks the stream
  (the connection drops without ``[DONE]``).
- Non-streamed usage: ``prompt_tokens`` counts the raw message contents (not the templated prompt) × ``n``,
  no ``prompt_tokens_details``; a failed non-streamed generation is a plain 500 "Internal Server Error".
- No prefix cache (DeepSpeed's block size 128), no ``/metrics``, no tokenize route.

Not reproduced: the gRPC load balancer and replicas, ``/generate``, the Flask REST gateway, API keys.
"""

from __future__ import annotations

import argparse
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from kvgate_core.tokenize.request_prompt import Endpoint
from tests.support.engines.core import FakeEngine
from tests.support.engines.oai_request import Job
from tests.support.engines.oai_response import Formatter, Reply, json_response, permission_model_list
from tests.support.engines.server import FakeServer, build_app, engine_config

NAME = "mii"
VERSION = "0.3.3"
DEFAULT_MODEL = "fake-org/mii-fake"
INVALID_MODEL = 40301
VALIDATION_TYPE_ERROR = 40001
BLOCK_SIZE = 128


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broken", action="store_true", help="every generation fails; /health stays 200")
    parser.add_argument("--deployment-name", default="deepspeed-mii")


class MiiFormatter(Formatter):
    stream_usage = False

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def envelope(self, reply: Reply, *, chunk: bool) -> dict[str, Any]:
        out = super().envelope(reply, chunk=chunk)
        if chunk:  # exclude_unset: the defaults object/created are not written (completions set object)
            return {
                "id": out["id"],
                **({} if reply.chat else {"object": out["object"]}),
                "model": out["model"],
            }
        return out

    def role_chunk(self, reply: Reply) -> dict[str, Any] | None:
        if not reply.chat:
            return None
        choice = {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}
        return {**self.envelope(reply, chunk=True), "choices": [choice]}

    def choice(self, reply: Reply, text: str, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        if reply.chat:
            return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def usage(self, reply: Reply) -> dict[str, Any] | None:
        body = reply.job.body
        n = body.get("n") if isinstance(body.get("n"), int) else 1
        if reply.chat:
            contents = [
                m["content"] for m in body.get("messages") or () if isinstance(m, dict) and "content" in m
            ]
        else:
            prompt = body.get("prompt")
            contents = [prompt] if isinstance(prompt, str) else [str(p) for p in prompt or ()]
        prompt_tokens = sum(len(self.engine.bundle.tokenizer.encode(str(c))) for c in contents) * (n or 1)
        done = reply.gen.completion_tokens
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + done,
            "completion_tokens": done,
        }

    def response(self, reply: Reply, text: str, finish: str) -> dict[str, Any]:
        out = super().response(reply, text, finish)
        if reply.chat:  # MII's chat choice has no logprobs field
            del out["choices"][0]["logprobs"]
        return out

    def error_event(self, message: str) -> dict[str, Any] | None:
        return None  # a gRPC error inside the generator breaks the stream

    def error_response(self, status: int, message: str) -> Response:
        return json_response({"object": "error", "message": message, "code": VALIDATION_TYPE_ERROR}, 400)

    def failure_response(self, message: str) -> Response:
        return PlainTextResponse("Internal Server Error", 500)


def _messages_ok(messages: object) -> bool:
    if isinstance(messages, str):
        return True
    return isinstance(messages, list) and all(
        isinstance(m, dict) and all(isinstance(v, str) for v in m.values()) for m in messages
    )


def create_app(args: argparse.Namespace) -> Starlette:
    engine = FakeEngine(engine_config(args, block_size=BLOCK_SIZE, prefix_caching=False))
    engine.faults.broken = args.broken
    fmt = MiiFormatter(engine)

    def check(job: Job) -> Response | None:
        if job.model != args.model:
            message = (f'Model "{job.model}" not found. Please use "{args.model}".'
                       if job.endpoint is Endpoint.CHAT else f"Model {job.model} not found.")  # fmt: skip
            return json_response({"object": "error", "message": message, "code": INVALID_MODEL}, 400)
        if job.endpoint is Endpoint.CHAT and not _messages_ok(job.body.get("messages")):
            return fmt.error_response(400, "messages: str type expected")
        return None

    server = FakeServer(NAME, VERSION, engine, fmt, check=check, default_max_tokens=128)

    async def models(_: Request) -> Response:
        return json_response(permission_model_list(args.model, "deepspeed-mii"))

    async def health(_: Request) -> Response:
        return json_response({"status": "ok"})

    return build_app(server, [Route("/v1/models", models), Route("/health", health)])

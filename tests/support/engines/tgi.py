"""A fake Hugging Face TGI v3 server (Rust router + v3 backend), after its own source (the files read: docs/engines.md).

Version: text-generation-inference v3.3.7 (``main`` @ db931fc, 2026-01; ``router/src/{server,lib}.rs``,
``backends/v3/src``).

Reproduces:

- ``GET /v1/models``: one entry, ``id`` = ``owned_by`` = the model id, ``created`` 0.
- ``GET /info`` with the v3 router's ``Info`` keys (``model_id``, ``model_sha``, ``model_pipeline_tag``,
  ``max_concurrent_requests``, ``max_best_of``, ``max_stop_sequences``, ``max_input_tokens``,
  ``max_total_tokens``, ``validation_workers``, ``max_client_batch_size``, ``router``
  ("text-generation-router"), ``version``, ``sha``, ``docker_label``).
- ``GET /health`` (200, empty body).
- Prometheus ``/metrics`` always: ``tgi_queue_size`` (waiting), ``tgi_batch_current_size`` (running),
  ``tgi_batch_current_max_tokens`` (prompt + max new tokens reserved by the running batch),
  ``tgi_batch_max_total_tokens`` (capacity), counters ``tgi_request_count`` / ``_success`` / ``_failure``.
- ``POST /chat_tokenize`` (a full chat request) → ``{"tokenize_response": [{id, text, start, stop}…],
  "templated_text"}``, the chat path's exact tokens; ``POST /tokenize {"inputs"}`` → ``[{id, text, start,
  stop}…]`` with the special tokens added (a BOS first, so templated text gets a second one).
- Usage is ``{prompt_tokens, completion_tokens, total_tokens}`` only: never ``cached_tokens``. Non-streamed
  replies carry ``x-prompt-tokens``, ``x-generated-tokens``, ``x-compute-type`` headers.
- Streams: every chunk has ``"id": ""`` and ``role`` in every delta (no role-only first chunk), chunks echo
  the request's ``model`` unless it is "tgi" (``server.rs``; non-streamed replies name the served model id
  whatever was asked), ``system_fingerprint`` "3.3.7-native"; ``include_usage`` adds a
  ``choices: []`` chunk with ``id: ""``; SSE keep-alive comments (``:``) while no token comes for
  ``--keep-alive-s`` (axum's default 15 s); a mid-stream failure is ``data: {"error": {"message",
  "http_status_code"}}`` then ``data: [DONE]``.
- ``model`` ≠ "tgi" is taken as a LoRA adapter id and an unknown adapter silently serves the base model.
- Prefix caching in the router's radix trie at ``BLOCK_SIZE`` 1 under flashinfer (``--attention``:
  flashinfer 1, flashdecoding 256, paged 16; ``--no-prefix-caching``), never reported, no KV events.

Not reproduced: ``/generate``, ``/generate_stream``, ``/invocations``, ``/vertex``, grammars, tools.
"""

from __future__ import annotations

import argparse
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kvgate_core.tokenize.request_prompt import parse_chat
from tests.support.engines.core import BOS_ID, FakeEngine
from tests.support.engines.oai_request import BadRequestError, Job
from tests.support.engines.oai_response import Formatter, Reply, json_response
from tests.support.engines.prom import Sample, metrics_response
from tests.support.engines.server import FakeServer, build_app, engine_config, read_json

NAME = "tgi"
VERSION = "3.3.7"
DEFAULT_MODEL = "fake-org/tgi-fake"
FINGERPRINT = f"{VERSION}-native"
BLOCK_SIZES = {"flashinfer": 1, "flashdecoding": 256, "paged": 16}


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--attention", choices=sorted(BLOCK_SIZES), default="flashinfer", help="KV block size"
    )
    parser.add_argument("--no-prefix-caching", action="store_true", help="PREFIX_CACHING=0")
    parser.add_argument("--keep-alive-s", type=float, default=15.0, help="SSE keep-alive comment interval")
    parser.add_argument("--max-input-tokens", type=int, default=4095)
    parser.add_argument("--max-total-tokens", type=int, default=4096)


class TgiFormatter(Formatter):
    def __init__(self, model_id: str, keepalive_s: float) -> None:
        self.model_id = model_id
        self.keepalive_s = keepalive_s

    def chunk_id(self, reply: Reply) -> str:
        return ""

    def model_name(self, reply: Reply) -> str:
        return self.model_id

    def envelope(self, reply: Reply, *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if reply.chat else "text_completion"
        model = self.model_id
        if chunk and reply.job.model not in ("", "tgi"):  # streams echo the request's model (server.rs)
            model = reply.job.model
        return {"object": kind, "id": "", "created": reply.created, "model": model,
                "system_fingerprint": FINGERPRINT}  # fmt: skip

    def role_chunk(self, reply: Reply) -> dict[str, Any] | None:
        return None

    def token_chunk(self, reply: Reply, text: str, finish: str | None) -> dict[str, Any]:
        choice = self.choice(reply, text, finish, role=True)
        return {**self.envelope(reply, chunk=True), "choices": [choice], "usage": None}

    def error_event(self, message: str) -> dict[str, Any] | None:
        return {"error": {"message": message, "http_status_code": 424}}

    def error_response(self, status: int, message: str) -> Response:
        kind = "validation" if status == 422 else "generation"
        return json_response({"error": message, "error_type": kind}, status)

    def failure_response(self, message: str) -> Response:
        return self.error_response(424, message)

    def response_headers(self, reply: Reply) -> dict[str, str]:
        gen = reply.gen
        return {"x-compute-type": "gpu+optimized", "x-prompt-tokens": str(gen.prompt_tokens),
                "x-generated-tokens": str(gen.completion_tokens), "x-compute-time": "0.01"}  # fmt: skip


def token_rows(engine: FakeEngine, ids: list[int], *, bos: bool = False) -> list[dict[str, Any]]:
    """``{id, text, start, stop}`` per token, byte offsets into the text (an added BOS spans 0..0)."""
    rows: list[dict[str, Any]] = []
    pos = 0
    if bos:
        rows.append({"id": BOS_ID, "text": engine.bundle.tokenizer.decode([BOS_ID]), "start": 0, "stop": 0})
    for tid in ids:
        piece = engine.bundle.tokenizer.decode([tid])
        width = len(piece.encode()) if tid >= 256 else 1
        rows.append({"id": tid, "text": piece, "start": pos, "stop": pos + width})
        pos += width
    return rows


def _metrics(engine: FakeEngine, server: FakeServer) -> Response:
    s = engine.stats()
    requests = server.paths["POST /v1/chat/completions"] + server.paths["POST /v1/completions"]
    return metrics_response([
        Sample("tgi_queue_size", s.waiting), Sample("tgi_batch_current_size", s.running),
        Sample("tgi_batch_current_max_tokens", s.reserved_tokens), Sample("tgi_batch_max_total_tokens", s.kv_tokens),
        Sample("tgi_request_count", requests, kind="counter"),
        Sample("tgi_request_success", s.finished_total, kind="counter"),
        Sample("tgi_request_failure", max(0, requests - s.finished_total - s.running - s.waiting), kind="counter"),
    ])  # fmt: skip


def create_app(args: argparse.Namespace) -> Starlette:
    block = BLOCK_SIZES[args.attention]
    engine = FakeEngine(engine_config(args, block_size=block, prefix_caching=not args.no_prefix_caching))
    fmt = TgiFormatter(args.model, args.keep_alive_s)

    def check(job: Job) -> Response | None:
        if job.body.get("tools") and job.body.get("response_format"):
            return fmt.error_response(422, "Grammar and tools are mutually exclusive")
        n = len(job.prompt_ids)
        if n > args.max_input_tokens:
            return fmt.error_response(422, f"Input validation error: `inputs` must have less than "
                                           f"{args.max_input_tokens} tokens. Given: {n}")  # fmt: skip
        if n + job.max_tokens > args.max_total_tokens:
            return fmt.error_response(422, f"Input validation error: `inputs` tokens + `max_new_tokens` must "
                                           f"be <= {args.max_total_tokens}. Given: {n} `inputs` tokens and "
                                           f"{job.max_tokens} `max_new_tokens`")  # fmt: skip
        return None

    server = FakeServer(NAME, VERSION, engine, fmt, check=check, default_max_tokens=100,
                        make_id=lambda _e: "")  # fmt: skip

    async def models(_: Request) -> Response:
        card = {"id": args.model, "object": "model", "created": 0, "owned_by": args.model}
        return json_response({"object": "list", "data": [card]})

    async def info(_: Request) -> Response:
        return json_response({
            "model_id": args.model, "model_sha": None, "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": 128, "max_best_of": 2, "max_stop_sequences": 4,
            "max_input_tokens": args.max_input_tokens, "max_total_tokens": args.max_total_tokens,
            "validation_workers": 2, "max_client_batch_size": 4, "router": "text-generation-router",
            "version": VERSION, "sha": "db931fc", "docker_label": None,
        })  # fmt: skip

    async def health(_: Request) -> Response:
        if engine.faults.unhealthy:  # router/src/server.rs: 503 with the health check's error
            return json_response({"error": "unhealthy", "error_type": "healthcheck"}, 503)
        return Response(status_code=200)

    async def metrics(_: Request) -> Response:
        return _metrics(engine, server)

    async def tokenize(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), str):
            return fmt.error_response(422, "Failed to deserialize the JSON body: missing field `inputs`")
        return json_response(token_rows(engine, engine.bundle.tokenizer.encode(body["inputs"]), bos=True))

    async def chat_tokenize(request: Request) -> Response:
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise BadRequestError("the request body must be a JSON object")
            text = engine.bundle.render(parse_chat(body))
        except (BadRequestError, ValueError) as exc:
            return fmt.error_response(422, str(exc))
        ids = engine.bundle.tokenizer.encode(text)
        return json_response({"tokenize_response": token_rows(engine, ids), "templated_text": text})

    routes = [
        Route("/v1/models", models), Route("/info", info), Route("/health", health), Route("/metrics", metrics),
        Route("/tokenize", tokenize, methods=["POST"]), Route("/chat_tokenize", chat_tokenize, methods=["POST"]),
    ]  # fmt: skip
    return build_app(server, routes, fastapi_404=False)

"""``POST /v1/chat/completions`` and ``POST /v1/completions`` over an ``Engine``.

The handler validates and submits before answering (so bad requests get their status before any byte is
sent), then returns a ``GenerationResponse``: a plain ASGI response that streams SSE or collects the whole
text of its ``n`` choices, watches for the client's disconnect, and always closes the engine streams
(aborting the sequences and freeing their blocks) when it ends early. ``submit`` is shared with the
Responses API (``responses_routes``).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from kvgate_core.kvcontract.extra_keys import TENANT_HEADER
from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.request_prompt import Endpoint
from workers.engine_api import Engine, EngineError, GenerationChunk, GenerationRequest, GenerationStream
from workers.server.asgi_response import SSE_HEADERS, WatchedResponse, send_whole
from workers.server.choices import merge_choices
from workers.server.errors import ApiError, bad_request, error_body, from_engine_error
from workers.server.openai_io import (
    SSE_DONE,
    ParsedRequest,
    ResponseFormatter,
    parse_body,
    parse_request,
    prompt_param,
)
from workers.server.response_store import ResponseStore

logger = logging.getLogger(__name__)
_TENANT_HEADER = TENANT_HEADER.encode()


@dataclass(slots=True)
class WorkerContext:
    """What the routes need, built once by ``create_app``."""

    engine: Engine
    bundle: TokenizerBundle
    ids: itertools.count[int]
    id_prefix: str
    owned_by: str = "kvgate"  # the model card's ``owned_by`` (what a gateway detects the engine by)
    responses: ResponseStore = field(default_factory=ResponseStore)  # finished Responses API objects

    def next_request_id(self, endpoint: Endpoint) -> str:
        kind = "chatcmpl" if endpoint is Endpoint.CHAT else "cmpl"
        return f"{kind}-{self.id_prefix}{next(self.ids):x}"


def new_context(
    engine: Engine, owned_by: str = "kvgate", responses: ResponseStore | None = None
) -> WorkerContext:
    store = ResponseStore() if responses is None else responses
    return WorkerContext(engine, engine.bundle, itertools.count(), os.urandom(4).hex() + "-", owned_by, store)


ENDPOINTS: Final = {"/v1/chat/completions": Endpoint.CHAT, "/v1/completions": Endpoint.COMPLETIONS}


async def chat_completions(request: Request) -> Response:
    return await prepare(request.app.state.worker, Endpoint.CHAT, await request.body())


async def completions(request: Request) -> Response:
    return await prepare(request.app.state.worker, Endpoint.COMPLETIONS, await request.body())


async def serve_generation(
    ctx: WorkerContext, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send
) -> None:
    """The generation routes as plain ASGI (the hot path skips Starlette's routing and middleware)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    try:
        response = await prepare(ctx, endpoint, b"".join(chunks), _tenant(scope))
    except Exception:  # a request boundary: answer, log, never crash the connection
        logger.exception("unexpected error preparing a generation request")
        response = from_engine_error(EngineError("unexpected")).response()
    await response(scope, receive, send)


def _tenant(scope: Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == _TENANT_HEADER:
            return bytes(value).decode("latin-1")
    return None


async def prepare(
    ctx: WorkerContext, endpoint: Endpoint, raw_body: bytes, tenant: str | None = None
) -> Response:
    """Validate, tokenize and submit a request; an error response or a ``GenerationResponse``.

    ``tenant`` (the ``x-kvgate-tenant`` header) is folded into the hash root, as the gateway does.
    """
    try:
        parsed = parse_request(parse_body(raw_body), endpoint, ctx.engine.model_id, tenant)
        request_id = ctx.next_request_id(endpoint)
        streams = await submit(ctx, parsed, request_id)
    except ApiError as exc:
        return exc.response()
    except EngineError as exc:
        return from_engine_error(exc).response()
    fmt = ResponseFormatter(endpoint, request_id, parsed.model, n=parsed.n)
    return GenerationResponse(streams, fmt, is_sse=parsed.stream, include_usage=parsed.include_usage)


async def submit(ctx: WorkerContext, parsed: ParsedRequest, request_id: str) -> list[GenerationStream]:
    """Tokenize the prompt and queue its ``n`` sequences; one stream per choice.

    Choice ``i > 0`` of a seeded request samples with ``seed + i`` (so the choices differ and replay);
    unseeded choices each draw their own seed. On an error, the sequences already queued are aborted.

    Raises:
        ApiError: the prompt does not render or tokenize (400).
        EngineError: the engine refused a sequence.
    """
    try:
        token_ids = tuple(ctx.bundle.encode(parsed.prompt))
    except ValueError as exc:  # chat template errors and bad prompts are the client's
        raise bad_request(str(exc), prompt_param(parsed.endpoint)) from exc
    sampling = parsed.sampling(len(token_ids), ctx.engine.max_model_len)
    streams: list[GenerationStream] = []
    try:
        for i in range(parsed.n):
            seed = sampling.seed
            params = sampling if i == 0 or seed is None else replace(sampling, seed=seed + i)
            rid = request_id if parsed.n == 1 else f"{request_id}-{i}"
            req = GenerationRequest(rid, token_ids, params, parsed.model, parsed.extra_keys, parsed.has_media)
            streams.append(ctx.engine.generate(req))
    except EngineError:
        for stream in streams:
            await stream.aclose()
        raise
    return streams


class GenerationResponse(WatchedResponse):
    """Streams (SSE) or collects the engine streams of a request's choices; aborts them if the client goes."""

    def __init__(
        self, streams: Sequence[GenerationStream], fmt: ResponseFormatter, *, is_sse: bool,
        include_usage: bool,
    ) -> None:  # fmt: skip
        super().__init__()
        self._streams = streams
        self._fmt = fmt
        self._is_sse = is_sse
        self._include_usage = include_usage

    async def write(self, send: Send) -> None:
        if self._is_sse:
            await self._send_sse(send)
        else:
            await self._send_json(send)

    async def close(self) -> None:
        for stream in self._streams:
            await stream.aclose()

    async def _send_sse(self, send: Send) -> None:
        # Frames are coalesced (role with the first text, the last text with usage and [DONE]): one write
        # each, since the syscalls dominate a short stream's cost.
        fmt = self._fmt
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        pending = fmt.sse_role()
        lasts: dict[int, GenerationChunk] = {}
        try:
            async with aclosing(merge_choices(self._streams)) as chunks:
                async for index, chunk in chunks:
                    lasts[index] = chunk
                    fr = None if chunk.finish_reason is None else chunk.finish_reason.value
                    if fr is not None:
                        pending += fmt.sse_chunk(chunk.text, fr, index)
                    elif chunk.text:
                        body = pending + fmt.sse_chunk(chunk.text, None, index)
                        pending = b""
                        await send({"type": "http.response.body", "body": body, "more_body": True})
        except EngineError as exc:
            logger.warning("engine error mid-stream: %s", exc)
            pending += b"data: " + error_body(str(exc), type_="internal_error") + b"\n\n"
        if self._include_usage and lasts:
            pending += fmt.sse_usage([lasts[i] for i in sorted(lasts)])
        await send({"type": "http.response.body", "body": pending + SSE_DONE, "more_body": False})

    async def _send_json(self, send: Send) -> None:
        n = len(self._streams)
        parts: list[list[str]] = [[] for _ in range(n)]
        lasts: dict[int, GenerationChunk] = {}
        try:
            async with aclosing(merge_choices(self._streams)) as chunks:
                async for index, chunk in chunks:
                    parts[index].append(chunk.text)
                    lasts[index] = chunk
        except EngineError as exc:
            error = from_engine_error(exc)
            body = error_body(error.message, type_=error.type, param=error.param, code=error.code)
            await send_whole(send, error.status, body)
            return
        if len(lasts) != n:
            raise RuntimeError("an engine stream ended without a final chunk")
        texts = ["".join(p) for p in parts]
        await send_whole(send, 200, self._fmt.full(texts, [lasts[i] for i in range(n)]))


__all__ = ["GenerationResponse", "WorkerContext", "chat_completions", "completions", "new_context", "submit"]

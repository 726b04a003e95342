"""``POST /v1/chat/completions`` and ``POST /v1/completions`` over an ``Engine``.

The handler validates and submits synchronously (so bad requests get their status before any byte is
sent), then returns a ``GenerationResponse``: a plain ASGI response that streams SSE or collects the whole
text, watches for the client's disconnect, and always closes the engine stream (aborting the sequence and
freeing its blocks) when it ends early.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from kvgate_core.kvcontract.extra_keys import TENANT_HEADER
from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.request_prompt import Endpoint
from workers.engine_api import Engine, EngineError, GenerationChunk, GenerationRequest, GenerationStream
from workers.server.errors import ApiError, bad_request, error_body, from_engine_error
from workers.server.openai_io import SSE_DONE, ResponseFormatter, parse_body, parse_request

logger = logging.getLogger(__name__)
_TENANT_HEADER = TENANT_HEADER.encode()

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass(slots=True)
class WorkerContext:
    """What the routes need, built once by ``create_app``."""

    engine: Engine
    bundle: TokenizerBundle
    ids: itertools.count[int]
    id_prefix: str
    owned_by: str = "kvgate"  # the model card's ``owned_by`` (what a gateway detects the engine by)

    def next_request_id(self, endpoint: Endpoint) -> str:
        kind = "chatcmpl" if endpoint is Endpoint.CHAT else "cmpl"
        return f"{kind}-{self.id_prefix}{next(self.ids):x}"


def new_context(engine: Engine, owned_by: str = "kvgate") -> WorkerContext:
    return WorkerContext(engine, engine.bundle, itertools.count(), os.urandom(4).hex() + "-", owned_by)


ENDPOINTS: Final = {"/v1/chat/completions": Endpoint.CHAT, "/v1/completions": Endpoint.COMPLETIONS}


async def chat_completions(request: Request) -> Response:
    return prepare(request.app.state.worker, Endpoint.CHAT, await request.body())


async def completions(request: Request) -> Response:
    return prepare(request.app.state.worker, Endpoint.COMPLETIONS, await request.body())


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
        response = prepare(ctx, endpoint, b"".join(chunks), _tenant(scope))
    except Exception:  # a request boundary: answer, log, never crash the connection
        logger.exception("unexpected error preparing a generation request")
        response = from_engine_error(EngineError("unexpected")).response()
    await response(scope, receive, send)


def _tenant(scope: Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == _TENANT_HEADER:
            return bytes(value).decode("latin-1")
    return None


def prepare(ctx: WorkerContext, endpoint: Endpoint, raw_body: bytes, tenant: str | None = None) -> Response:
    """Validate, tokenize and submit a request; an error response or a ``GenerationResponse``.

    ``tenant`` (the ``x-kvgate-tenant`` header) is folded into the hash root, as the gateway does.
    """
    engine = ctx.engine
    try:
        parsed = parse_request(parse_body(raw_body), endpoint, engine.model_id, tenant)
        try:
            token_ids = ctx.bundle.encode(parsed.prompt)
        except ValueError as exc:  # chat template errors and bad prompts are the client's
            raise bad_request(str(exc), "messages" if endpoint is Endpoint.CHAT else "prompt") from exc
        sampling = parsed.sampling(len(token_ids), engine.max_model_len)
        request_id = ctx.next_request_id(endpoint)
        gen_req = GenerationRequest(request_id, tuple(token_ids), sampling, parsed.model, parsed.extra_keys)
        stream = engine.generate(gen_req)
    except ApiError as exc:
        return exc.response()
    except EngineError as exc:
        return from_engine_error(exc).response()
    fmt = ResponseFormatter(endpoint, request_id, parsed.model)
    return GenerationResponse(stream, fmt, is_sse=parsed.stream, include_usage=parsed.include_usage)


class GenerationResponse(Response):
    """Streams (SSE) or collects one engine stream; aborts it if the client leaves first."""

    def __init__(
        self, stream: GenerationStream, fmt: ResponseFormatter, *, is_sse: bool, include_usage: bool
    ) -> None:  # fmt: skip
        self._stream = stream
        self._fmt = fmt
        self._is_sse = is_sse
        self._include_usage = include_usage
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None, "ASGI apps run in a task"
        watcher = asyncio.create_task(_cancel_on_disconnect(receive, task))
        try:
            if self._is_sse:
                await self._send_sse(send)
            else:
                await self._send_json(send)
        except asyncio.CancelledError:
            if not (watcher.done() and not watcher.cancelled()):
                raise
            task.uncancel()  # the client left: nothing to answer
        finally:
            watcher.cancel()
            await self._stream.aclose()

    async def _send_sse(self, send: Send) -> None:
        # Frames are coalesced (role with the first text, the last text with usage and [DONE]): one write
        # each, since the syscalls dominate a short stream's cost.
        fmt = self._fmt
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        pending = fmt.sse_role()
        last: GenerationChunk | None = None
        try:
            async for chunk in self._stream:
                last = chunk
                fr = None if chunk.finish_reason is None else chunk.finish_reason.value
                if fr is not None:
                    pending += fmt.sse_chunk(chunk.text, fr)
                elif chunk.text:
                    body = pending + fmt.sse_chunk(chunk.text, None)
                    pending = b""
                    await send({"type": "http.response.body", "body": body, "more_body": True})
        except EngineError as exc:
            logger.warning("engine error mid-stream: %s", exc)
            pending += b"data: " + error_body(str(exc), type_="internal_error") + b"\n\n"
        if self._include_usage and last is not None:
            pending += fmt.sse_usage(last)
        await send({"type": "http.response.body", "body": pending + SSE_DONE, "more_body": False})

    async def _send_json(self, send: Send) -> None:
        parts: list[str] = []
        last: GenerationChunk | None = None
        try:
            async for chunk in self._stream:
                parts.append(chunk.text)
                last = chunk
        except EngineError as exc:
            error = from_engine_error(exc)
            body = error_body(error.message, type_=error.type, param=error.param, code=error.code)
            await _send_whole(send, error.status, body)
            return
        if last is None:
            raise RuntimeError("the engine stream ended without a final chunk")
        await _send_whole(send, 200, self._fmt.full("".join(parts), last))


async def _send_whole(send: Send, status: int, body: bytes) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[object]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    task.cancel()


__all__ = ["GenerationResponse", "WorkerContext", "chat_completions", "completions", "new_context"]

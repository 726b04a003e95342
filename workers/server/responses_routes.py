"""``/v1/responses``: the OpenAI Responses API over the same engine path as chat.

``POST /v1/responses`` renders ``instructions`` and ``input`` as a chat prompt (``parse_prompt`` with
``Endpoint.RESPONSES``) and submits it exactly as chat does (same KV hashing, events and cached-token
accounting). With ``previous_response_id``, the stored conversation of that response comes before the new
input; the new request's ``instructions`` replace the old ones, as OpenAI does. A finished response with
``store`` (default true) is kept in the worker's ``ResponseStore`` for ``GET``/``DELETE`` and for
continuation. Background mode is not supported: ``background: true`` is a 400, and so is cancelling any
response (only background responses can be cancelled).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from kvgate_core.kvcontract.extra_keys import TENANT_HEADER
from kvgate_core.tokenize.request_prompt import Endpoint
from workers.engine_api import EngineError, GenerationChunk, GenerationStream
from workers.server.asgi_response import SSE_HEADERS, WatchedResponse, send_whole
from workers.server.errors import ApiError, bad_request, error_body, from_engine_error
from workers.server.generation import WorkerContext, submit
from workers.server.openai_io import ParsedRequest, parse_body, parse_request
from workers.server.response_store import ResponseStore, StoredResponse
from workers.server.responses_api import (
    EventWriter,
    ResponseHead,
    deleted_object,
    finished_object,
    response_object,
)

logger = logging.getLogger(__name__)

Item = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class _Plan:
    """A validated Responses request: the parsed prompt, the response's head, the conversation so far."""

    parsed: ParsedRequest
    head: ResponseHead
    conversation: tuple[Item, ...]  # the stored history, then this request's input items
    store: bool


def _ctx(request: Request) -> WorkerContext:
    ctx: WorkerContext = request.app.state.worker
    return ctx


def _json(doc: object, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status, media_type="application/json")


async def create_response(request: Request) -> Response:
    """``POST /v1/responses``: a Response object, or its event stream with ``"stream": true``."""
    ctx = _ctx(request)
    try:
        body = parse_body(await request.body())
        plan = _plan(ctx, body, request.headers.get(TENANT_HEADER))
        streams = await submit(ctx, plan.parsed, plan.head.id)
    except ApiError as exc:
        return exc.response()
    except EngineError as exc:
        error = from_engine_error(exc)
        if error.param == "messages":  # the engine names chat's field; here the prompt is ``input``
            error.param = "input"
        return error.response()
    store = ctx.responses if plan.store else None
    return ResponsesResponse(streams[0], plan.head, plan.conversation, store, is_sse=plan.parsed.stream)


def _plan(ctx: WorkerContext, body: Mapping[str, Any], tenant: str | None) -> _Plan:
    if body.get("background") is True:
        raise bad_request("background mode is not supported by this worker: drop 'background'", "background")
    store = body.get("store", True)
    if not isinstance(store, bool | None):
        raise bad_request("'store' must be a boolean", "store")
    items = _history(ctx.responses, body.get("previous_response_id")) + _input_items(body.get("input"))
    parsed = parse_request({**body, "input": list(items)}, Endpoint.RESPONSES, ctx.engine.model_id, tenant)
    return _Plan(parsed, ResponseHead.create(body, parsed.model), items, store is not False)


def _history(store: ResponseStore, previous_id: object) -> tuple[Item, ...]:
    if previous_id is None:
        return ()
    if not isinstance(previous_id, str):
        raise bad_request("'previous_response_id' must be a string", "previous_response_id")
    entry = store.get(previous_id)
    if entry is None:
        raise ApiError(404, f"Previous response with id '{previous_id}' not found.",
                       param="previous_response_id", code="previous_response_not_found")  # fmt: skip
    return entry.conversation


def _input_items(value: object) -> tuple[Item, ...]:
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if isinstance(value, list):
        return tuple(value)
    if value is None:
        return ()
    raise bad_request("'input' must be a string or an array of input items", "input")


def _not_found(response_id: str) -> Response:
    return ApiError(404, f"Response with id '{response_id}' not found.").response()


async def retrieve_response(request: Request) -> Response:
    """``GET /v1/responses/{response_id}``: a stored Response object."""
    response_id = request.path_params["response_id"]
    entry = _ctx(request).responses.get(response_id)
    return _not_found(response_id) if entry is None else _json(entry.response)


async def delete_response(request: Request) -> Response:
    """``DELETE /v1/responses/{response_id}``: forget a stored response."""
    response_id = request.path_params["response_id"]
    if not _ctx(request).responses.delete(response_id):
        return _not_found(response_id)
    return _json(deleted_object(response_id))


async def cancel_response(request: Request) -> Response:
    """``POST /v1/responses/{response_id}/cancel``: only background responses can be; none are here."""
    response_id = request.path_params["response_id"]
    if _ctx(request).responses.get(response_id) is None:
        return _not_found(response_id)
    return ApiError(400, "Only background responses can be cancelled.").response()


class ResponsesResponse(WatchedResponse):
    """Streams the events of, or answers, one response; stores it when it finishes (``store``)."""

    def __init__(
        self, stream: GenerationStream, head: ResponseHead, conversation: tuple[Item, ...],
        store: ResponseStore | None, *, is_sse: bool,
    ) -> None:  # fmt: skip
        super().__init__()
        self._stream = stream
        self._head = head
        self._conversation = conversation
        self._store = store
        self._is_sse = is_sse

    async def write(self, send: Send) -> None:
        if self._is_sse:
            await self._send_sse(send)
        else:
            await self._send_json(send)

    async def close(self) -> None:
        await self._stream.aclose()

    async def _send_sse(self, send: Send) -> None:
        writer = EventWriter(self._head)
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": writer.opening(), "more_body": True})
        parts: list[str] = []
        pending = b""
        last: GenerationChunk | None = None
        try:
            async for chunk in self._stream:
                if chunk.text:
                    parts.append(chunk.text)
                    pending = writer.delta(chunk.text)
                if chunk.finish_reason is None and pending:
                    await send({"type": "http.response.body", "body": pending, "more_body": True})
                    pending = b""
                last = chunk
        except EngineError as exc:
            logger.warning("engine error mid-stream: %s", exc)
            error = {"code": "server_error", "message": str(exc)}
            final = response_object(self._head, "failed", error=error)
        else:
            final = self._finish("".join(parts), last)
        body = pending + writer.closing("".join(parts), final)
        await send({"type": "http.response.body", "body": body, "more_body": False})

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
            await send_whole(send, error.status, body)
            return
        await send_whole(send, 200, orjson.dumps(self._finish("".join(parts), last)))

    def _finish(self, text: str, last: GenerationChunk | None) -> dict[str, Any]:
        if last is None:
            raise RuntimeError("the engine stream ended without a final chunk")
        final = finished_object(self._head, text, last)
        if self._store is not None and final["status"] != "failed":
            turn = {"role": "assistant", "content": text}
            self._store.put(self._head.id, StoredResponse(final, (*self._conversation, turn)))
        return final

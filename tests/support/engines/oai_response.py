"""OpenAI-shaped replies of the fakes: ``Formatter`` builds standard shapes, each engine overrides what its
server does differently, and ``sse_stream`` / ``full_response`` drive a ``Generation`` through it.

A stream is: an optional role-only first chunk, one chunk per token (the last carries ``finish_reason``),
the usage chunk (``choices: []``) when the client asked for ``include_usage`` and the engine reports
streaming usage, then ``data: [DONE]``. While no token arrives for ``keepalive_s`` an SSE comment ``:`` is
written. A mid-stream failure becomes the engine's error event followed by ``[DONE]``, or, where the engine
has no error event (``error_event`` returns None), an exception that makes the server drop the connection
without finishing the chunked body.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from kvgate_core.tokenize.request_prompt import Endpoint
from tests.support.engines.core import Done, EngineFailureError, Generation
from tests.support.engines.oai_request import Job

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b":\n\n"


@dataclass(slots=True)
class Reply:
    """One request being answered: the parsed job, its id and creation time, the engine's generation."""

    job: Job
    request_id: str
    gen: Generation
    created: int = 0

    def __post_init__(self) -> None:
        self.created = self.created or int(time.time())

    @property
    def chat(self) -> bool:
        return self.job.endpoint is Endpoint.CHAT


def drop_none(obj: Any) -> Any:
    """``obj`` without None values at any depth (pydantic's ``exclude_none``)."""
    if isinstance(obj, dict):
        return {k: drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [drop_none(v) for v in obj]
    return obj


class Formatter:
    """Standard OpenAI shapes; subclasses override what their engine writes differently."""

    keepalive_s: float | None = None
    stream_usage: bool = True

    def chunk_id(self, reply: Reply) -> str:
        return reply.request_id

    def model_name(self, reply: Reply) -> str:
        return reply.job.model

    def envelope(self, reply: Reply, *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if reply.chat else "text_completion"
        rid = self.chunk_id(reply) if chunk else reply.request_id
        return {"id": rid, "object": kind, "created": reply.created, "model": self.model_name(reply)}

    def choice(self, reply: Reply, text: str, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        if not reply.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def role_chunk(self, reply: Reply) -> dict[str, Any] | None:
        if not reply.chat:
            return None
        return {**self.envelope(reply, chunk=True), "choices": [self.choice(reply, "", None, role=True)]}

    def token_chunk(self, reply: Reply, text: str, finish: str | None) -> dict[str, Any]:
        return {**self.envelope(reply, chunk=True), "choices": [self.choice(reply, text, finish)]}

    def usage(self, reply: Reply) -> dict[str, Any] | None:
        gen = reply.gen
        done = gen.completion_tokens
        return {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": gen.prompt_tokens + done,
        }

    def usage_chunk(self, reply: Reply) -> dict[str, Any] | None:
        return {**self.envelope(reply, chunk=True), "choices": [], "usage": self.usage(reply)}

    def response(self, reply: Reply, text: str, finish: str) -> dict[str, Any]:
        if reply.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": finish}  # fmt: skip
        else:
            choice = self.choice(reply, text, finish)
        return {**self.envelope(reply, chunk=False), "choices": [choice], "usage": self.usage(reply)}

    def error_event(self, message: str) -> dict[str, Any] | None:
        """The SSE event a mid-stream failure becomes; None: the engine drops the connection instead."""
        return {"error": {"object": "error", "message": message, "type": "InternalServerError", "param": None,
                          "code": 500}}  # fmt: skip

    def error_response(self, status: int, message: str) -> Response:
        body = {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": status,
        }
        return json_response(body, status)

    def failure_response(self, message: str) -> Response:
        """The reply to a non-streamed request whose generation failed."""
        return self.error_response(500, message)

    def response_headers(self, reply: Reply) -> dict[str, str]:
        """Extra headers of a non-streamed reply."""
        return {}

    def frame(self, obj: dict[str, Any], *, first: bool) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"


def permission_model_list(model: str, owned_by: str) -> dict[str, Any]:
    """``GET /v1/models`` in the FastChat-derived shape LMDeploy and MII share: one card with ``root`` and a
    ``model_permission`` entry."""
    now = int(time.time())
    permission = {"id": f"modelperm-{now:x}", "object": "model_permission", "created": now,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": True, "allow_view": True, "allow_fine_tuning": False,
                  "organization": "*", "group": None, "is_blocking": False}  # fmt: skip
    card = {"id": model, "object": "model", "created": now, "owned_by": owned_by, "root": model,
            "parent": None, "permission": [permission]}  # fmt: skip
    return {"object": "list", "data": [card]}


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


async def sse_stream(fmt: Formatter, reply: Reply) -> AsyncIterator[bytes]:
    """The SSE body of a streamed reply (see the module docstring); cancels the generation when closed."""
    gen, first = reply.gen, True
    try:
        role = fmt.role_chunk(reply)
        if role is not None:
            yield fmt.frame(role, first=True)
            first = False
        finished = False
        while not finished:
            try:
                item = await gen.next(fmt.keepalive_s)
            except EngineFailureError as exc:
                event = fmt.error_event(str(exc))
                if event is None:
                    raise  # no error event in this engine: the connection drops without [DONE]
                yield fmt.frame(event, first=first)
                yield DONE
                return
            if item is None:
                yield KEEPALIVE
            elif isinstance(item, Done):
                if gen.completion_tokens == 0:
                    yield fmt.frame(fmt.token_chunk(reply, "", item.finish_reason), first=first)
                finished = True
            else:
                yield fmt.frame(fmt.token_chunk(reply, item.text, item.finish_reason), first=first)
                first = False
        usage = fmt.usage_chunk(reply) if reply.job.include_usage and fmt.stream_usage else None
        if usage is not None:
            yield fmt.frame(usage, first=False)
        yield DONE
    finally:
        gen.cancel()


async def full_response(fmt: Formatter, reply: Reply) -> Response:
    """The non-streamed reply; a failure becomes the engine's ``failure_response``."""
    try:
        text, finish = await reply.gen.collect()
    except EngineFailureError as exc:
        return fmt.failure_response(str(exc))
    finally:
        reply.gen.cancel()
    resp = json_response(fmt.response(reply, text, finish))
    resp.headers.update(fmt.response_headers(reply))
    return resp

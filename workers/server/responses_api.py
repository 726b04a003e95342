"""The OpenAI Responses API wire format: Response objects, their output message and the SSE events.

Pure formatting, no I/O: ``responses_routes`` decides what happened and asks here how to say it. A
streamed response is the event sequence OpenAI sends for one text message, each event framed as
``event: <type>\\ndata: <json>\\n\\n`` with a ``sequence_number`` counting from 0: ``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``…, ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``, then ``response.completed`` / ``response.incomplete`` / ``response.failed``
with the final object. There is no ``[DONE]`` line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from workers.engine_api import FinishReason, GenerationChunk

#: request fields a Response object echoes, with OpenAI's defaults
_ECHOED: dict[str, Any] = {
    "instructions": None,
    "previous_response_id": None,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}},
    "truncation": "disabled",
    "user": None,
}


def new_id(prefix: str) -> str:
    """An OpenAI-style id: ``resp_…`` or ``msg_…`` and 48 random hex digits."""
    return f"{prefix}_{os.urandom(24).hex()}"


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """What a Response object says from the start: ids, time, model, and the request fields it echoes."""

    id: str
    message_id: str
    created_at: int
    model: str
    echo: Mapping[str, Any]

    @classmethod
    def create(cls, body: Mapping[str, Any], model: str) -> ResponseHead:
        """The head of a new response to a validated ``body`` (limits as the client sent them)."""
        echo = {key: body.get(key, default) for key, default in _ECHOED.items()}
        tools = body.get("tools")
        echo |= {
            "max_output_tokens": body.get("max_output_tokens"),
            "temperature": _number_or(body, "temperature", 1.0),
            "top_p": _number_or(body, "top_p", 1.0),
            "tools": tools if isinstance(tools, list) else [],
            "metadata": body.get("metadata") or {},
            "store": body.get("store", True) is not False,
        }
        return cls(new_id("resp"), new_id("msg"), int(time.time()), model, echo)


def _number_or(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    return default if value is None else float(value)


def message_item(head: ResponseHead, text: str | None, status: str) -> dict[str, Any]:
    """The assistant message output item (``text=None``: the item as first announced, with no content)."""
    content = [] if text is None else [output_text(text)]
    return {"type": "message", "id": head.message_id, "status": status, "role": "assistant",
            "content": content}  # fmt: skip


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def usage_object(last: GenerationChunk) -> dict[str, Any]:
    """The Responses API ``usage`` from a sequence's last chunk."""
    return {
        "input_tokens": last.num_prompt_tokens,
        "input_tokens_details": {"cached_tokens": last.num_cached_tokens},
        "output_tokens": last.num_output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": last.num_prompt_tokens + last.num_output_tokens,
    }


def final_status(last: GenerationChunk) -> str:
    """``completed``, ``incomplete`` (the length limit stopped it) or ``failed`` (the engine aborted it)."""
    if last.finish_reason is FinishReason.LENGTH:
        return "incomplete"
    return "failed" if last.finish_reason is FinishReason.ABORT else "completed"


def response_object(
    head: ResponseHead,
    status: str,
    *,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Response object in ``status`` (``in_progress`` while streaming, then its final status)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": head.id,
        "object": "response",
        "created_at": head.created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "model": head.model,
        "output": output or [],
        "reasoning": {"effort": None, "summary": None},
        "usage": usage,
        **head.echo,
    }


def finished_object(head: ResponseHead, text: str, last: GenerationChunk) -> dict[str, Any]:
    """The final Response object of a sequence that ended with ``last``."""
    status = final_status(last)
    if status == "failed":
        error = {"code": "server_error", "message": "the engine stopped before the response finished"}
        return response_object(head, status, usage=usage_object(last), error=error)
    item = message_item(head, text, "completed" if status == "completed" else "incomplete")
    return response_object(head, status, output=[item], usage=usage_object(last))


class EventWriter:
    """Frames one response's SSE events, numbering them from 0."""

    __slots__ = ("_head", "_seq")

    def __init__(self, head: ResponseHead) -> None:
        self._head = head
        self._seq = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        doc = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(doc) + b"\n\n"

    def opening(self) -> bytes:
        """``created``, ``in_progress``, and the announced message item with its empty text part."""
        head = self._head
        started = response_object(head, "in_progress")
        at = {"item_id": head.message_id, "output_index": 0, "content_index": 0}
        item = message_item(head, None, "in_progress")
        return (
            self.event("response.created", response=started)
            + self.event("response.in_progress", response=started)
            + self.event("response.output_item.added", output_index=0, item=item)
            + self.event("response.content_part.added", **at, part=output_text(""))
        )

    def delta(self, text: str) -> bytes:
        """One ``response.output_text.delta``."""
        return self.event("response.output_text.delta", item_id=self._head.message_id, output_index=0,
                          content_index=0, delta=text, logprobs=[])  # fmt: skip

    def closing(self, text: str, final: Mapping[str, Any]) -> bytes:
        """The text, part and item ``done`` events, then the event of the final object's status."""
        at = {"item_id": self._head.message_id, "output_index": 0, "content_index": 0}
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            final["status"], "response.failed"
        )
        output = final["output"]
        item = output[0] if output else message_item(self._head, text, "incomplete")
        return (
            self.event("response.output_text.done", **at, text=text, logprobs=[])
            + self.event("response.content_part.done", **at, part=output_text(text))
            + self.event("response.output_item.done", output_index=0, item=item)
            + self.event(kind, response=final)
        )


def deleted_object(response_id: str) -> dict[str, Any]:
    """What ``DELETE /v1/responses/{id}`` answers."""
    return {"id": response_id, "object": "response.deleted", "deleted": True}

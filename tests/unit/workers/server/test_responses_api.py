"""The Responses API wire format: object shape, final status, event order and numbering."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from workers.engine_api import FinishReason, GenerationChunk
from workers.server.responses_api import EventWriter, ResponseHead, finished_object, response_object

SPEC_KEYS = {
    "id", "object", "created_at", "status", "model", "output", "usage", "previous_response_id",
    "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
    "parallel_tool_calls", "text", "truncation", "metadata", "error", "incomplete_details", "store",
}  # fmt: skip


def _last(reason: FinishReason | None) -> GenerationChunk:
    return GenerationChunk((1,), "", reason, num_prompt_tokens=40, num_cached_tokens=32, num_output_tokens=5)


def _head(**body: object) -> ResponseHead:
    return ResponseHead.create({"input": "hi", **body}, "m")


def _events(payload: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in payload.decode().split("\n\n"):
        if frame:
            event_line, data_line = frame.split("\n")
            doc = orjson.loads(data_line.removeprefix("data: "))
            assert event_line == f"event: {doc['type']}"
            out.append((doc["type"], doc))
    return out


def test_a_completed_response_has_openais_fields_and_usage() -> None:
    head = _head(instructions="be brief", max_output_tokens=9, metadata={"k": "v"}, temperature=0)
    obj = finished_object(head, "hello", _last(FinishReason.STOP))
    assert set(obj) >= SPEC_KEYS
    assert obj["id"].startswith("resp_") and obj["object"] == "response"
    assert (obj["status"], obj["incomplete_details"], obj["error"]) == ("completed", None, None)
    assert (obj["instructions"], obj["max_output_tokens"], obj["temperature"]) == ("be brief", 9, 0.0)
    assert (obj["tools"], obj["tool_choice"], obj["store"], obj["metadata"]) == ([], "auto", True, {"k": "v"})
    [item] = obj["output"]
    assert item["id"].startswith("msg_") and item["status"] == "completed" and item["role"] == "assistant"
    assert item["content"] == [{"type": "output_text", "text": "hello", "annotations": []}]
    assert obj["usage"] == {
        "input_tokens": 40, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 45,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("reason", "status"),
    [(FinishReason.STOP, "completed"), (FinishReason.LENGTH, "incomplete"), (FinishReason.ABORT, "failed")],
    ids=["stop", "length", "abort"],
)
def test_the_finish_reason_decides_the_status(reason: FinishReason, status: str) -> None:
    obj = finished_object(_head(store=False), "x", _last(reason))
    assert obj["status"] == status
    assert obj["store"] is False
    if status == "incomplete":
        assert obj["incomplete_details"] == {"reason": "max_output_tokens"}
        assert obj["output"][0]["status"] == "incomplete"
    if status == "failed":
        assert obj["error"]["code"] == "server_error"


def test_events_come_in_openais_order_numbered_from_zero() -> None:
    head = _head()
    writer = EventWriter(head)
    final = finished_object(head, "ab", _last(FinishReason.STOP))
    events = _events(writer.opening() + writer.delta("a") + writer.delta("b") + writer.closing("ab", final))
    assert [kind for kind, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [doc["sequence_number"] for _, doc in events] == list(range(10))
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    delta = events[4][1]
    assert (delta["item_id"], delta["output_index"], delta["content_index"]) == (head.message_id, 0, 0)
    assert delta["logprobs"] == []
    assert events[6][1]["text"] == "ab"
    assert events[-1][1]["response"] == final


def test_an_incomplete_or_failed_stream_ends_with_its_own_event() -> None:
    head = _head()
    incomplete = finished_object(head, "a", _last(FinishReason.LENGTH))
    failed = response_object(head, "failed", error={"code": "server_error", "message": "boom"})
    assert _events(EventWriter(head).closing("a", incomplete))[-1][0] == "response.incomplete"
    ended = _events(EventWriter(head).closing("a", failed))
    assert ended[-1][0] == "response.failed"
    assert ended[-2][1]["item"]["status"] == "incomplete"

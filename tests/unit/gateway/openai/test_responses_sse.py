"""``StreamWatch``: a Responses API stream's id before the client sees it, its end and its usage."""

from __future__ import annotations

import orjson
import pytest

from gateway.openai.responses_sse import StreamWatch, response_id_of, responses_error_frames
from gateway.openai.schema import Framing
from gateway.openai.sse import TokenUsage


def _event(kind: str, data: dict[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


RESPONSE = {"id": "resp_abc", "object": "response", "status": "in_progress", "output": []}
DONE = {**RESPONSE, "status": "completed", "usage": {
    "input_tokens": 40, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 5, "total_tokens": 45,
}}  # fmt: skip
STREAM = (
    _event("response.created", {"response": RESPONSE, "sequence_number": 0})
    + _event("response.in_progress", {"response": RESPONSE, "sequence_number": 1})
    + b"".join(
        _event("response.output_text.delta", {"delta": f"tok{i} ", "item_id": "m", "sequence_number": 2 + i})
        for i in range(5)
    )
    + _event("response.completed", {"response": DONE, "sequence_number": 7})
)


@pytest.mark.parametrize("size", [1, 7, 33, 100, len(STREAM)])
def test_id_end_and_usage_are_found_however_the_stream_is_cut(size: int) -> None:
    watch = StreamWatch(Framing.RESPONSES)
    id_seen_at = None
    for offset in range(0, len(STREAM), size):
        watch.feed(STREAM[offset : offset + size])
        if id_seen_at is None and watch.response_id is not None:
            id_seen_at = offset + size
    assert watch.response_id == "resp_abc"
    first_event_end = STREAM.index(b"\n\n") + 2
    assert id_seen_at is not None and id_seen_at - size < first_event_end  # with the read that completes it
    assert watch.ended
    assert watch.usage() == TokenUsage(40, 32)


def test_a_stream_without_its_terminal_event_has_not_ended() -> None:
    watch = StreamWatch(Framing.RESPONSES)
    watch.feed(STREAM[: STREAM.index(b"event: response.completed")])
    assert watch.response_id == "resp_abc"
    assert not watch.ended
    assert watch.usage() is None


@pytest.mark.parametrize("terminal", ["response.incomplete", "response.failed"])
def test_incomplete_and_failed_end_a_stream_too(terminal: str) -> None:
    watch = StreamWatch(Framing.RESPONSES)
    watch.feed(_event("response.created", {"response": RESPONSE}) + _event(terminal, {"response": RESPONSE}))
    assert watch.ended


def test_a_delta_that_quotes_a_terminal_type_is_not_an_end() -> None:
    watch = StreamWatch(Framing.RESPONSES)
    watch.feed(_event("response.created", {"response": RESPONSE}))
    watch.feed(_event("response.output_text.delta", {"delta": 'the type "response.completed" ends it'}))
    assert not watch.ended


def test_a_head_without_an_id_is_not_held_forever() -> None:
    watch = StreamWatch(Framing.RESPONSES)
    for _ in range(200):
        watch.feed(_event("response.output_text.delta", {"delta": "x" * 1000}))
    assert watch.response_id is None
    assert watch._head is None  # gave up after the bounded head


def test_eof_framing_reads_nothing() -> None:
    watch = StreamWatch(Framing.EOF)
    watch.feed(STREAM)
    assert watch.response_id is None and not watch.ended


def test_the_error_event_is_a_responses_error() -> None:
    frame = responses_error_frames("worker broke", "worker_unavailable")
    assert frame.startswith(b"event: error\ndata: ") and frame.endswith(b"\n\n")
    data = orjson.loads(frame.split(b"data: ", 1)[1])
    assert data["type"] == "error" and data["code"] == "worker_unavailable"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"id":"resp_1","object":"response"}', "resp_1"),
        (b'  {\n  "id" : "resp_2", "x": 1}', "resp_2"),
        (b'{"object":"response","id":"resp_3"}', "resp_3"),  # not first: parsed
        (b'{"object":"response"}', None),
        (b"not json", None),
        (b'["resp_4"]', None),
    ],
)
def test_the_id_of_a_whole_answer(body: bytes, expected: str | None) -> None:
    assert response_id_of(body) == expected

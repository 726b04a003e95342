"""How the load tools count a request's end: ok, shed, failed or cut, from what the client saw."""

from __future__ import annotations

import orjson
import pytest

from loadtest.outcomes import (
    Kind,
    SseScan,
    classify_error_status,
    classify_json,
    classify_stream,
    error_shape_ok,
)

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
DONE = b"data: [DONE]\n\n"
ERROR_EVENT = (
    b'data: {"error":{"message":"worker went away","type":"upstream_error","param":null,'
    b'"code":"worker_unavailable"}}\n\n'
)
SHED_BODY = orjson.dumps(
    {"error": {"message": "full", "type": "server_error", "param": None, "code": "overloaded"}}
)


def _scan(stream: bytes, piece: int) -> SseScan:
    scan = SseScan()
    for i in range(0, len(stream), piece):
        scan.feed(stream[i : i + piece])
    return scan


@pytest.mark.parametrize("piece", [1, 3, 7, 64, 10_000])
def test_a_complete_stream_is_ok_however_the_bytes_are_split(piece: int) -> None:
    scan = _scan(CHUNK * 5 + DONE, piece)
    assert (scan.done, scan.data_frames, scan.error) == (True, 5, None)
    assert classify_stream(scan) == (Kind.OK, "")


@pytest.mark.parametrize("piece", [1, 5, 10_000])
def test_a_stream_ended_by_an_error_event_is_cut(piece: int) -> None:
    kind, detail = classify_stream(_scan(CHUNK * 2 + ERROR_EVENT + DONE, piece))
    assert kind is Kind.CUT
    assert "worker_unavailable" in detail


def test_a_stream_without_done_is_failed_as_truncated() -> None:
    kind, detail = classify_stream(_scan(CHUNK * 3 + b'data: {"choi', 10_000))
    assert kind is Kind.FAILED
    assert "truncated" in detail


def test_crlf_lines_and_comments_are_understood() -> None:
    scan = _scan(b": keep-alive\r\n\r\n" + CHUNK.replace(b"\n", b"\r\n") + b"data:[DONE]\r\n\r\n", 4)
    assert classify_stream(scan) == (Kind.OK, "")


def test_an_error_after_done_does_not_count() -> None:
    assert classify_stream(_scan(CHUNK + DONE + ERROR_EVENT, 10_000))[0] is Kind.OK


@pytest.mark.parametrize(
    ("status", "headers", "body", "kind"),
    [
        (503, {"retry-after": "1"}, SHED_BODY, Kind.SHED),
        (503, {}, SHED_BODY, Kind.FAILED),  # no Retry-After
        (503, {"retry-after": "1"}, b"Service Unavailable", Kind.FAILED),  # not OpenAI's shape
        (503, {"retry-after": "1"}, b'{"error": "full"}', Kind.FAILED),
        (502, {}, SHED_BODY, Kind.FAILED),
        (429, {"retry-after": "1"}, SHED_BODY, Kind.FAILED),
    ],
)
def test_only_a_503_with_retry_after_and_the_error_shape_is_a_shed(
    status: int, headers: dict[str, str], body: bytes, kind: Kind
) -> None:
    assert classify_error_status(status, headers, body)[0] is kind


def test_error_shape_needs_message_and_type() -> None:
    assert error_shape_ok(SHED_BODY)
    assert not error_shape_ok(b'{"error": {"message": "x"}}')
    assert not error_shape_ok(b"[]")
    assert not error_shape_ok(b"nope")


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b'{"choices": [{"index": 0, "text": "hi"}]}', Kind.OK),
        (b'{"choices": []}', Kind.FAILED),
        (b'{"error": {"message": "x", "type": "y"}}', Kind.FAILED),
        (b"<html>", Kind.FAILED),
    ],
)
def test_a_200_json_answer_needs_choices(body: bytes, kind: Kind) -> None:
    assert classify_json(body)[0] is kind

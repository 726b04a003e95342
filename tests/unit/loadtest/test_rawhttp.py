"""The raw HTTP/1.1 client against an in-process server that answers canned bytes, cut where a test says."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import orjson
import pytest

from loadtest.outcomes import Kind
from loadtest.rawhttp import Call, OpenGauge, Target, parse_head, request_bytes, send

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
ERROR_EVENT = b'data: {"error":{"message":"gone","type":"upstream_error","code":"worker_unavailable"}}\n\n'
SHED = orjson.dumps({"error": {"message": "full", "type": "server_error", "code": "overloaded"}})
STREAM = Call("/v1/chat/completions", b'{"stream": true}', stream=True)
PLAIN = Call("/v1/completions", b"{}", stream=False)


def _chunked(*frames: bytes, end: bool = True) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames)
    return head + body + (b"0\r\n\r\n" if end else b"")


def _sized(status: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s" % (
        status, extra, len(body), body,
    )  # fmt: skip


@pytest.fixture
async def canned(port: int) -> AsyncIterator[tuple[Target, list[bytes]]]:
    """A server that reads one request, writes the next canned answer in small pieces and closes."""
    answers: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        answer = answers.pop(0)
        if answer == b"hang":
            await asyncio.sleep(5)
        for i in range(0, len(answer), 7):
            writer.write(answer[i : i + 7])
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        yield Target("127.0.0.1", port), answers


async def test_a_complete_chunked_stream_is_ok_with_a_ttfb(canned: tuple[Target, list[bytes]]) -> None:
    target, answers = canned
    answers.append(_chunked(CHUNK, CHUNK * 3, b"data: [DONE]\n\n"))
    gauge = OpenGauge()
    out = await send(target, STREAM, timeout_s=5, gauge=gauge)
    assert (out.kind, out.status) == (Kind.OK, 200)
    assert out.ttfb_s is not None and out.ttfb_s > 0
    assert (gauge.open, gauge.peak) == (0, 1)


async def test_a_stream_closed_before_done_is_failed(canned: tuple[Target, list[bytes]]) -> None:
    target, answers = canned
    answers.append(_chunked(CHUNK, CHUNK, end=False))
    out = await send(target, STREAM, timeout_s=5)
    assert out.kind is Kind.FAILED
    assert "IncompleteReadError after HTTP 200" in out.detail


async def test_an_error_event_is_a_cut_even_if_the_connection_then_drops(
    canned: tuple[Target, list[bytes]],
) -> None:
    target, answers = canned
    answers += [_chunked(CHUNK, ERROR_EVENT + b"data: [DONE]\n\n"), _chunked(CHUNK, ERROR_EVENT, end=False)]
    assert (await send(target, STREAM, timeout_s=5)).kind is Kind.CUT
    assert (await send(target, STREAM, timeout_s=5)).kind is Kind.CUT


async def test_sized_answers(canned: tuple[Target, list[bytes]]) -> None:
    target, answers = canned
    answers += [
        _sized(b"503 Service Unavailable", SHED, b"retry-after: 1\r\n"),
        _sized(b"503 Service Unavailable", SHED),
        _sized(b"502 Bad Gateway", SHED),
        _sized(b"200 OK", b'{"choices": [{"text": "hi"}]}'),
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + b'{"choices": [{"text": "to EOF"}]}',
    ]
    kinds = [(await send(target, PLAIN, timeout_s=5)).kind for _ in range(5)]
    assert kinds == [Kind.SHED, Kind.FAILED, Kind.FAILED, Kind.OK, Kind.OK]


async def test_a_shed_stream_request_is_still_a_shed(canned: tuple[Target, list[bytes]]) -> None:
    target, answers = canned
    answers.append(_sized(b"503 Service Unavailable", SHED, b"retry-after: 2\r\n"))
    assert (await send(target, STREAM, timeout_s=5)).kind is Kind.SHED


async def test_a_timeout_and_a_refused_connection_fail_without_raising(
    canned: tuple[Target, list[bytes]],
) -> None:
    target, answers = canned
    answers.append(b"hang")
    out = await send(target, PLAIN, timeout_s=0.2)
    assert (out.kind, out.ttfb_s) == (Kind.FAILED, None)
    assert "TimeoutError before the response" in out.detail
    with socket.socket() as bound_not_listening:
        bound_not_listening.bind(("127.0.0.1", 0))
        closed = Target("127.0.0.1", bound_not_listening.getsockname()[1])
        refused = await send(closed, PLAIN, timeout_s=2)
    assert refused.kind is Kind.FAILED
    assert "ConnectionRefusedError" in refused.detail


def test_request_bytes_and_parse_head() -> None:
    raw = request_bytes(Target("127.0.0.1", 8000), Call("/v1/x", b"{}", stream=True))
    assert raw.startswith(b"POST /v1/x HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n")
    assert b"content-length: 2\r\n" in raw and raw.endswith(b"\r\n\r\n{}")
    status, headers = parse_head(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nX-A:b\r\n\r\n")
    assert (status, headers) == (503, {"retry-after": "1", "x-a": "b"})
    with pytest.raises(ValueError, match="not an HTTP response"):
        parse_head(b"SSH-2.0\r\n\r\n")
    assert Target.from_url("http://127.0.0.1:9/") == Target("127.0.0.1", 9)

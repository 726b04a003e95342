"""``gateway.openai.sse`` on the shapes engines really send: [DONE], cached tokens, the usage-chunk filter."""

from __future__ import annotations

import pytest

from gateway.openai.sse import TokenUsage, UsageChunkFilter, ends_stream, usage_chunk_of, usage_in
from tests.unit.gateway.proxy.engine_sse import (
    DONE,
    KEEP_ALIVE,
    content,
    crlf,
    event,
    mii_stream,
    tgi_stream,
    trtllm_stream,
    usage,
    vllm_stream,
)


@pytest.mark.parametrize(
    "chunk",
    [
        DONE,
        b"data:[DONE]\r\n\r\n",
        b"data: [DONE] \n\n",
        b"data: [DONE]",
        event(content("x")) + DONE,
        KEEP_ALIVE + DONE,
    ],
)
def test_ends_stream_on_every_done_shape(chunk: bytes) -> None:
    assert ends_stream(chunk)


@pytest.mark.parametrize(
    "chunk",
    [
        event(content("x")),
        KEEP_ALIVE,
        b": [DONE]\n\n",
        DONE + KEEP_ALIVE,
        event(content("[DONE]")),
        b"[DONE]\n\n",
    ],
)
def test_ends_stream_only_on_a_done_data_line_at_the_end(chunk: bytes) -> None:
    assert not ends_stream(chunk)


@pytest.mark.parametrize(
    "chunk",
    [
        event(usage(4)),
        event(usage(4), sep=b"data:"),
        event(usage(4), end=b" \n\n"),
        event(usage(4), end=b"\r\n\r\n"),
        KEEP_ALIVE + event(usage(4)) + DONE,
        event(content("x", usage=None)) + event(usage(4)),  # "usage": null before the real report
        event(usage(4, chunk_id="")),
    ],
)
def test_usage_in_tolerates_engine_shapes(chunk: bytes) -> None:
    assert usage_in(chunk) == TokenUsage(prompt_tokens=5, cached_tokens=4)


def test_usage_in_without_a_report() -> None:
    assert usage_in(event(content("x", usage=None))) is None
    assert usage_in(event(usage(None))) == TokenUsage(prompt_tokens=5, cached_tokens=None)  # TGI's usage
    assert usage_in(b'data: {"usage":{"prompt_tokens"') is None  # cut by the read


def cached_of(strip: UsageChunkFilter) -> int | None:
    return strip.usage.cached_tokens if strip.usage is not None else None


def test_usage_chunk_of_recognises_only_the_final_usage_chunk() -> None:
    assert usage_chunk_of(event(usage(4))) is not None
    assert usage_chunk_of(event(usage(None, chunk_id=""), end=b"\r\n\r\n")) is not None
    assert usage_chunk_of(event(content("x", usage={"prompt_tokens": 1}))) is None  # continuous usage stats
    assert usage_chunk_of(event({"choices": [], "usage": None})) is None
    tool = content("x")
    tool["choices"][0]["delta"]["tool_calls"] = []
    assert usage_chunk_of(event(tool)) is None


STREAMS = {
    "vllm": (vllm_stream(), 4),
    "vllm_crlf": (crlf(vllm_stream()), 4),
    "tgi": (tgi_stream(), None),
    "trtllm": (trtllm_stream(), 2),
}


def _expected(chunks: list[bytes]) -> bytes:
    return b"".join(c for c in chunks if usage_chunk_of(c) is None)


def _run(reads: list[bytes]) -> tuple[bytes, UsageChunkFilter]:
    strip = UsageChunkFilter()
    out = b"".join(strip.feed(r) for r in reads) + strip.flush()
    return out, strip


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_filter_drops_the_usage_chunk_read_by_read(name: str) -> None:
    chunks, cached = STREAMS[name]
    strip = UsageChunkFilter()
    for chunk in chunks:
        out = strip.feed(chunk)
        assert out == (b"" if usage_chunk_of(chunk) else chunk)  # whole events pass at once, unchanged
    assert strip.flush() == b""
    assert strip.seen
    assert cached_of(strip) == cached


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_filter_handles_any_split_and_any_coalescing(name: str) -> None:
    chunks, cached = STREAMS[name]
    whole = b"".join(chunks)
    for cut in range(1, len(whole)):
        out, strip = _run([whole[:cut], whole[cut:]])
        assert out == _expected(chunks), cut
        assert cached_of(strip) == cached
    out, strip = _run([whole])
    assert (out, cached_of(strip)) == (_expected(chunks), cached)
    out, strip = _run([whole[i : i + 1] for i in range(len(whole))])
    assert (out, cached_of(strip)) == (_expected(chunks), cached)


def test_filter_usage_chunk_and_done_in_one_read() -> None:
    chunks = vllm_stream(cached=9)
    out, strip = _run([*chunks[:-2], chunks[-2] + chunks[-1]])
    assert out == _expected(chunks)
    assert out.endswith(event(content("w2 ")) + DONE)
    assert cached_of(strip) == 9


def test_filter_holds_only_the_unfinished_event() -> None:
    strip = UsageChunkFilter()
    first, second = event(content("a")), event(content("b"))
    assert strip.feed(first + second[:10]) == first
    assert strip.feed(second[10:]) == second


def test_filter_passes_a_stream_without_usage_unchanged() -> None:
    chunks = mii_stream(done=False)
    out, strip = _run(chunks)
    assert out == b"".join(chunks)
    assert not strip.seen
    assert cached_of(strip) is None


def test_filter_flushes_an_unterminated_last_event() -> None:
    out, _ = _run([event(content("a")), b"data: [DONE]"])
    assert out == event(content("a")) + b"data: [DONE]"
    out, strip = _run([event(content("a")), event(usage(3))[:-2]])
    assert (out, cached_of(strip)) == (event(content("a")), 3)


def test_filter_keeps_error_events_and_keep_alives() -> None:
    error = b'data: {"error":{"message":"boom","type":"x","param":null,"code":500}}\n\n'
    chunks = [KEEP_ALIVE, event(content("a")), error, DONE]
    out, _ = _run(chunks)
    assert out == b"".join(chunks)

"""The streaming relay per engine, read by read: usage chunk dropped but counted, [DONE] rules, SSE shapes.

The upstream is scripted (each item one ``read_chunk``), so splits and coalesced reads are exact.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from gateway.engines.profiles import EngineKind
from gateway.fleet.breaker import BreakerState, CircuitBreaker
from gateway.fleet.registry import WorkerRecord
from gateway.openai.schema import parse_request
from gateway.openai.sse import TokenUsage, usage_chunk_of
from gateway.proxy.shaping import shape
from gateway.proxy.stream import Result, StreamRelay
from gateway.routing.router import Routed
from gateway.settings import Timeouts
from kvgate_core.h1 import Target
from kvgate_core.h1_connection import UpstreamConnectionError
from kvgate_core.tokenize.request_prompt import Endpoint
from policies.api import Decision, Role, RouteRequest, WorkerId
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

STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
ASKED = {**STREAM, "stream_options": {"include_usage": True}}


@dataclass
class ScriptedConnection:
    """Answers 200 and hands out ``reads`` one per ``read_chunk``; then the end, or a broken connection."""

    reads: deque[bytes]
    broken: bool = False
    status: int = 200
    content_type: bytes = b"text/event-stream"

    @property
    def drained(self) -> bool:
        return not self.reads and not self.broken

    async def read_chunk(self) -> bytes:
        await asyncio.sleep(0)
        if self.reads:
            return self.reads.popleft()
        if self.broken:
            raise UpstreamConnectionError("worker closed the connection")
        return b""

    async def read_all(self) -> bytes:
        """The rest of the body (the relay reads an error status's body this way)."""
        body = b"".join(self.reads)
        self.reads.clear()
        if self.broken:
            raise UpstreamConnectionError("worker closed the connection")
        return body


@dataclass
class ScriptedPool:
    conn: ScriptedConnection
    released: int = 0

    async def post(self, target: Target, request: bytes, limit: int | None = None) -> ScriptedConnection:
        return self.conn

    def release(self, target: Target, conn: ScriptedConnection) -> None:
        self.released += 1


@dataclass
class Relayed:
    result: Result
    body: bytes
    record: WorkerRecord
    answered: list[bool] = field(default_factory=list)

    @property
    def events(self) -> list[bytes]:
        return [e for e in self.body.replace(b"\r\n", b"\n").split(b"\n\n") if e]


async def _never_disconnects() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def relay(
    reads: list[bytes], kind: EngineKind, *, body: dict[str, Any] = STREAM, broken: bool = False
) -> Relayed:
    record = WorkerRecord(
        id="w", url="http://127.0.0.1:9", role=Role.BOTH,
        breaker=CircuitBreaker(failures=1, open_s=60.0, clock=time.monotonic),
    )  # fmt: skip
    record.facts.kind = kind
    raw = orjson.dumps(body)
    shaped = shape(
        parse_request(raw, Endpoint.CHAT, max_tokens_limit=4096), raw, record.facts, want_usage=True
    )
    routed = Routed(
        request=RouteRequest(model="m"),
        decision=Decision(worker=WorkerId("w")),
        record=record,
        prefix_hit_tokens=0,
    )
    pool = ScriptedPool(ScriptedConnection(deque(reads), broken=broken))
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    out = Relayed(Result(0, ok=False), b"", record)
    relayer = StreamRelay(pool, Timeouts(connect_s=1.0, ttfb_s=2.0, idle_s=2.0))
    out.result = await relayer.relay(
        routed, Target.parse(record.url), b"", _never_disconnects, send, want_usage=True,
        on_answered=lambda *, answered: out.answered.append(answered), shaped=shaped,
    )  # fmt: skip
    assert sent[0]["type"] == "http.response.start"
    assert sent[-1]["more_body"] is False
    assert all(m["body"] for m in sent[1:-1]), "no empty body messages mid-stream"
    out.body = b"".join(m["body"] for m in sent[1:])
    assert pool.released == 1
    return out


def _without_usage(chunks: list[bytes]) -> bytes:
    return b"".join(c for c in chunks if usage_chunk_of(c) is None)


@pytest.mark.parametrize("kind", [EngineKind.VLLM, EngineKind.SGLANG, EngineKind.LMDEPLOY, EngineKind.OPENAI])
async def test_injected_usage_chunk_is_dropped_and_counted(kind: EngineKind) -> None:
    chunks = vllm_stream(cached=4)
    out = await relay(chunks, kind)
    assert out.body == _without_usage(chunks)
    assert b'"usage"' not in out.body
    assert out.result == Result(200, ok=True, usage=TokenUsage(5, 4), ttfb_s=out.result.ttfb_s)
    assert out.answered == [True]
    assert out.record.breaker.state is BreakerState.CLOSED


async def test_usage_chunk_split_across_reads() -> None:
    chunks = vllm_stream(cached=7)
    report = chunks[-2]
    reads = [*chunks[:-2], report[:25], report[25:60], report[60:] + DONE]
    out = await relay(reads, EngineKind.VLLM)
    assert out.body == _without_usage(chunks)
    assert out.result.cached_tokens == 7


async def test_usage_chunk_and_done_in_one_read_and_several_events_per_read() -> None:
    chunks = vllm_stream(cached=3, words=4)
    reads = [chunks[0] + chunks[1], chunks[2], chunks[3] + chunks[4][:5], chunks[4][5:] + chunks[5]]
    out = await relay(reads, EngineKind.VLLM)
    assert out.body == _without_usage(chunks)
    assert out.result.cached_tokens == 3
    assert out.result.ok


async def test_tgi_usage_chunk_with_empty_id_is_dropped_and_keep_alives_pass() -> None:
    chunks = tgi_stream()
    out = await relay(chunks, EngineKind.TGI)
    assert out.body == _without_usage(chunks)
    assert KEEP_ALIVE in out.body
    assert b'"choices":[]' not in out.body
    assert out.result.ok
    assert out.result.cached_tokens is None  # TGI never reports it: "unreported", not 0


@pytest.mark.parametrize(
    ("chunks", "cached"),
    [(trtllm_stream(cached=2), 2), (crlf(vllm_stream(cached=5)), 5)],
    ids=["trtllm", "crlf"],
)
async def test_trailing_space_crlf_and_no_space_after_data(chunks: list[bytes], cached: int) -> None:
    out = await relay(chunks, EngineKind.TRTLLM)
    assert out.body == _without_usage(chunks)
    assert (out.result.ok, out.result.cached_tokens) == (True, cached)


async def test_client_that_asked_for_usage_gets_it_and_the_gateway_reads_it() -> None:
    chunks = vllm_stream(cached=4)
    out = await relay(chunks, EngineKind.VLLM, body=ASKED)
    assert out.body == b"".join(chunks)
    assert out.result.cached_tokens == 4


@pytest.mark.parametrize("kind", [EngineKind.VLLM, EngineKind.TRTLLM, EngineKind.KVGATE])
@pytest.mark.parametrize("body", [STREAM, ASKED], ids=["injected", "asked"])
async def test_eof_without_done_is_a_failed_stream(kind: EngineKind, body: dict[str, Any]) -> None:
    chunks = vllm_stream()[:-1]  # the usage chunk came, [DONE] never did
    out = await relay(chunks, kind, body=body)
    assert out.events[-1] == b"data: [DONE]"
    error = orjson.loads(out.events[-2][len(b"data: ") :])["error"]
    assert error["code"] == "worker_unavailable"
    assert "before [DONE]" in error["message"]
    assert not out.result.ok
    assert out.record.breaker.state is BreakerState.OPEN  # counted like a dead worker
    assert out.answered == []


async def test_mii_ends_a_good_stream_with_done() -> None:
    chunks = mii_stream(done=True)
    out = await relay(chunks, EngineKind.MII)
    assert out.body == b"".join(chunks)
    assert out.result.ok
    assert out.answered == [True]
    assert out.record.breaker.state is BreakerState.CLOSED


async def test_mii_eof_without_done_is_a_broken_stream() -> None:
    # MII 0.3.3 sends [DONE] after its last chunk; a gRPC failure breaks the stream without it
    out = await relay(mii_stream(done=False), EngineKind.MII)
    assert b'"code":"worker_unavailable"' in out.events[-2]
    assert out.events[-1] == b"data: [DONE]"
    assert not out.result.ok


async def test_mii_broken_connection_is_still_a_failure() -> None:
    out = await relay(mii_stream(done=False), EngineKind.MII, broken=True)
    assert b'"code":"worker_unavailable"' in out.events[-2]
    assert out.events[-1] == b"data: [DONE]"
    assert out.record.breaker.state is BreakerState.OPEN


@pytest.mark.parametrize("kind", [EngineKind.VLLM, EngineKind.KVGATE])
async def test_done_split_across_reads_still_ends_the_stream(kind: EngineKind) -> None:
    chunks = [event(content("a")), b"data: [DO", b"NE]\n\n"]
    out = await relay(chunks, kind)
    assert out.body == b"".join(chunks)
    assert out.result.ok
    assert out.answered == [True]


async def test_kvgate_stream_is_relayed_as_sent() -> None:
    chunks = [event(content("a")), KEEP_ALIVE, event(usage(4)), DONE]
    out = await relay(chunks, EngineKind.KVGATE, body=ASKED)
    assert out.body == b"".join(chunks)
    assert out.result.cached_tokens == 4

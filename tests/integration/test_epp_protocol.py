"""``kvgate epp`` driven directly over its ext_proc gRPC stream (no Envoy), in front of sim workers."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb, external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.epp_fleet import (
    EppFleet,
    body_messages,
    destination,
    epp_fleet,
    exchange,
    headers_message,
    response_headers_message,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MODEL = "kvgate-sim"
CHAT = "/v1/chat/completions"


def _chat(text: str, **extra: object) -> bytes:
    return orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **extra}
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EppFleet]:
    with epp_fleet(tmp_path_factory.mktemp("epp")) as f:
        yield f


def _kinds(answers: list[pb.ProcessingResponse]) -> list[str]:
    return [str(a.WhichOneof("response")) for a in answers]


def _streamed(answers: list[pb.ProcessingResponse]) -> list[pb.StreamedBodyResponse]:
    return [
        a.request_body.response.body_mutation.streamed_response for a in answers if a.HasField("request_body")
    ]


def test_headers_answer_comes_after_the_body_then_the_body_in_order(fleet: EppFleet) -> None:
    body = _chat("hello " * 300)
    answers = asyncio.run(exchange(fleet.target, [headers_message(CHAT), *body_messages(body, 700)]))
    assert _kinds(answers)[0] == "request_headers"
    header, meta = destination(answers[0])
    assert header == meta and header in fleet.workers
    assert answers[0].request_headers.response.clear_route_cache
    sets = {
        h.header.key: h.header.raw_value
        for h in answers[0].request_headers.response.header_mutation.set_headers
    }
    assert sets["content-length"] == str(len(body)).encode()
    streamed = _streamed(answers)
    assert b"".join(s.body for s in streamed) == body
    assert [s.end_of_stream for s in streamed] == [False] * (len(streamed) - 1) + [True]


def test_large_body_is_sent_back_in_chunks_of_at_most_62000_bytes(fleet: EppFleet) -> None:
    body = _chat("x" * 3_000_000)
    answers = asyncio.run(exchange(fleet.target, [headers_message(CHAT), *body_messages(body, 65536)]))
    streamed = _streamed(answers)
    assert all(len(s.body) <= 62_000 for s in streamed) and len(streamed) > 40
    assert b"".join(s.body for s in streamed) == body
    assert streamed[-1].end_of_stream and not any(s.end_of_stream for s in streamed[:-1])


def test_client_supplied_destination_is_overwritten(fleet: EppFleet) -> None:
    spoof = {"x-gateway-destination-endpoint": "10.9.9.9:1"}
    answers = asyncio.run(
        exchange(fleet.target, [headers_message(CHAT, extra=spoof), *body_messages(_chat("hi"))])
    )
    header, _ = destination(answers[0])
    assert header in fleet.workers
    option = next(
        h
        for h in answers[0].request_headers.response.header_mutation.set_headers
        if h.header.key == "x-gateway-destination-endpoint"
    )
    assert option.append_action == option.OVERWRITE_IF_EXISTS_OR_ADD


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_request"),
        (orjson.dumps({"messages": [{"role": "user", "content": "x"}]}), 400, "invalid_request"),
        (
            orjson.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
            404,
            "model_not_found",
        ),
        (  # a large body is parsed off the loop, its structure bounded first (gateway.analyze.offload)
            orjson.dumps({"model": "kvgate-sim", "messages": [{"role": "user", "content": "x"}] * 70_000}),
            400,
            "too_many_objects",
        ),
    ],
    ids=["malformed-json", "no-model", "unknown-model", "too-many-objects"],
)
def test_bad_requests_get_an_openai_error_as_immediate_response(
    fleet: EppFleet, body: bytes, status: int, code: str
) -> None:
    answers = asyncio.run(exchange(fleet.target, [headers_message(CHAT), *body_messages(body)]))
    assert _kinds(answers) == ["immediate_response"]
    immediate = answers[0].immediate_response
    assert immediate.status.code == status
    assert orjson.loads(immediate.body)["error"]["code"] == code


def test_subset_hint_limits_the_pick_and_an_empty_subset_is_503(fleet: EppFleet) -> None:
    chosen = fleet.workers[1]
    for subset in (chosen, [chosen]):
        answers = asyncio.run(
            exchange(fleet.target, [headers_message(CHAT, subset=subset), *body_messages(_chat("a"))])
        )
        assert destination(answers[0])[0] == chosen
    answers = asyncio.run(
        exchange(fleet.target, [headers_message(CHAT, subset="10.0.0.1:9"), *body_messages(_chat("a"))])
    )
    assert answers[0].immediate_response.status.code == 503


def test_get_without_body_is_picked_at_once(fleet: EppFleet) -> None:
    answers = asyncio.run(
        exchange(fleet.target, [headers_message("/v1/models", method="GET", end_of_stream=True)])
    )
    assert _kinds(answers) == ["request_headers"]
    assert destination(answers[0])[0] in fleet.workers


def test_same_prefix_goes_to_the_same_endpoint(fleet: EppFleet) -> None:
    system = "You are a careful assistant. " * 40
    picks = set()
    for turn in range(4):
        body = orjson.dumps(
            {
                "model": MODEL,
                "max_tokens": 2,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"turn {turn}"},
                ],
            }
        )
        answers = asyncio.run(exchange(fleet.target, [headers_message(CHAT), *body_messages(body)]))
        picks.add(destination(answers[0])[0])
        # tell the picker the request ran there (the response phase), so the index learns the prefix
        sse = b'data: {"choices":[]}\n\ndata: [DONE]\n\n'
        asyncio.run(
            exchange(
                fleet.target,
                [
                    headers_message(CHAT),
                    *body_messages(body),
                    response_headers_message(200, "text/event-stream"),
                    *body_messages(sse, response=True),
                ],
            )
        )
    assert len(picks) == 1


def test_response_chunks_pass_through_unchanged_and_usage_is_read(fleet: EppFleet) -> None:
    chunks = [
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":9,',
        b'"prompt_tokens_details":{"cached_tokens":8}}}\n\ndata: [DONE]\n\n',
    ]
    response = [
        pb.ProcessingRequest(response_body=pb.HttpBody(body=c, end_of_stream=i == 2))
        for i, c in enumerate(chunks)
    ]
    messages = [
        headers_message(CHAT),
        *body_messages(_chat("u")),
        response_headers_message(200, "text/event-stream"),
    ]
    answers = asyncio.run(exchange(fleet.target, [*messages, *response]))
    kinds = _kinds(answers)
    assert kinds[-4:] == ["response_headers", "response_body", "response_body", "response_body"]
    echoed = [a.response_body.response.body_mutation.streamed_response for a in answers[-3:]]
    assert [e.body for e in echoed] == chunks and [e.end_of_stream for e in echoed] == [False, False, True]
    worker = next(
        h.header.raw_value
        for h in answers[-4].response_headers.response.header_mutation.set_headers
        if h.header.key == "x-kvgate-worker"
    )
    assert worker.decode() in fleet.workers
    metrics = httpx.get(f"http://127.0.0.1:{fleet.metrics_port}/metrics", timeout=5).text
    assert "kvgate_" in metrics


def test_served_endpoint_moves_the_accounting(fleet: EppFleet) -> None:
    messages = [
        headers_message(CHAT),
        *body_messages(_chat("served")),
        response_headers_message(200, "application/json", served=fleet.workers[0]),
    ]
    answers = asyncio.run(exchange(fleet.target, messages))
    worker = next(
        h.header.raw_value
        for h in answers[-1].response_headers.response.header_mutation.set_headers
        if h.header.key == "x-kvgate-worker"
    )
    assert worker.decode() == fleet.workers[0]


def test_cancelled_stream_releases_its_hold(fleet: EppFleet) -> None:
    async def cancel_mid_response() -> None:
        queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
        for m in [headers_message(CHAT), *body_messages(_chat("cancel me"))]:
            queue.put_nowait(m)

        async def requests() -> AsyncIterator[pb.ProcessingRequest]:
            while (m := await queue.get()) is not None:
                yield m

        async with grpc.aio.insecure_channel(fleet.target) as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process(requests(), timeout=20)
            first = await call.read()
            assert first.WhichOneof("response") == "request_headers"
            call.cancel()

    for _ in range(3):
        asyncio.run(cancel_mid_response())
    metrics = httpx.get(f"http://127.0.0.1:{fleet.metrics_port}/metrics", timeout=5).text
    inflight = [line for line in metrics.splitlines() if line.startswith("kvgate_worker_inflight_requests")]
    assert inflight and all(line.rstrip().endswith(" 0.0") for line in inflight), inflight


def test_health_answers_every_name(fleet: EppFleet) -> None:
    async def check(port: int, name: str) -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=name), timeout=5
            )
            return int(reply.status)

    names = [
        "",
        "liveness",
        "readiness",
        "inference-extension",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ]
    for port in (fleet.health_port, fleet.grpc_port):
        for name in names:
            assert asyncio.run(check(port, name)) == health_pb2.HealthCheckResponse.SERVING, (port, name)


def test_shed_when_every_endpoint_is_at_its_cap(tmp_path: Path) -> None:
    with epp_fleet(
        tmp_path, num_workers=1, epp_args=["--max-inflight", "1", "--max-body-bytes", "2000"]
    ) as f:

        async def scenario() -> tuple[int, int]:
            queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
            for m in [headers_message(CHAT), *body_messages(_chat("hold"))]:
                queue.put_nowait(m)

            async def held() -> AsyncIterator[pb.ProcessingRequest]:
                while (m := await queue.get()) is not None:
                    yield m

            async with grpc.aio.insecure_channel(f.target) as channel:
                call = pb_grpc.ExternalProcessorStub(channel).Process(held(), timeout=20)
                await call.read()  # picked: it holds the only endpoint now
                shed = await exchange(f.target, [headers_message(CHAT), *body_messages(_chat("second"))])
                big = await exchange(f.target, [headers_message(CHAT), *body_messages(_chat("y" * 5000))])
                call.cancel()
            return shed[0].immediate_response.status.code, big[0].immediate_response.status.code

        shed, big = asyncio.run(scenario())
        assert shed == 429
        assert big == 413


def test_sigterm_turns_readiness_off_first_then_drains_and_exits(tmp_path: Path) -> None:
    """On SIGTERM the picker answers NOT_SERVING for ``--drain-timeout-s`` (the gateways stop sending new
    streams) while a stream in flight still gets its answer; then it exits 0."""
    with epp_fleet(tmp_path, num_workers=1, epp_args=["--drain-timeout-s", "3"]) as f:
        epp = f.procs["epp"]

        async def scenario() -> tuple[int, int]:
            queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
            queue.put_nowait(headers_message(CHAT))

            async def held() -> AsyncIterator[pb.ProcessingRequest]:
                while (m := await queue.get()) is not None:
                    yield m

            async with grpc.aio.insecure_channel(f.target) as channel:
                call = pb_grpc.ExternalProcessorStub(channel).Process(held(), timeout=20)
                epp.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)
                health = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="readiness"), timeout=5
                )
                for m in body_messages(_chat("in flight during the drain")):
                    queue.put_nowait(m)
                answer = await call.read()  # the stream that was open still gets its pick
                call.cancel()
            return int(health.status), len(destination(answer)[0])

        status, picked = asyncio.run(scenario())
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert picked > 0
        assert epp.wait(timeout=30) == 0

"""The proxy path end to end in-process: forwarding, headers, failover, streaming failures, disconnects."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import orjson
import pytest

from gateway.deps import DepsOverrides
from gateway.settings import Timeouts
from gateway.state.memory import MemoryLoadBoard
from gateway.state.protocols import State
from policies.api import Decision, Need, RouteRequest, WorkerView
from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import serving, settings_for, until

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}


async def test_forwards_original_body_and_annotates_response() -> None:
    body = {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "seed": 7, "logprobs": True}
    async with (
        running(FakeWorker("a")) as (a,),
        serving(settings_for(a.url)) as base,
        httpx.AsyncClient() as client,
    ):
        resp = await client.post(f"{base}/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["x-kvgate-worker"] == f"127.0.0.1:{a.port}"
    assert resp.headers["x-kvgate-prefix-hit"] == "0"
    assert a.bodies == [body]
    assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 4


async def test_round_robin_spreads_over_workers() -> None:
    async with (
        running(FakeWorker("a"), FakeWorker("b")) as (a, b),
        serving(settings_for(a.url, b.url)) as base,
        httpx.AsyncClient() as client,
    ):
        seen = {
            (await client.post(f"{base}/v1/chat/completions", json=CHAT)).headers["x-kvgate-worker"]
            for _ in range(4)
        }
    assert len(seen) == 2


@pytest.mark.parametrize("mode", ["503", "hang"])
async def test_failing_worker_is_retried_elsewhere(mode: str) -> None:
    bad, good = FakeWorker("bad", mode=mode), FakeWorker("good")
    fast = Timeouts(connect_s=1.0, ttfb_s=0.3, idle_s=0.5)
    async with (
        running(bad, good),
        serving(settings_for(bad.url, good.url, timeouts=fast)) as base,
        httpx.AsyncClient(timeout=10) as client,
    ):
        for _ in range(4):
            resp = await client.post(f"{base}/v1/chat/completions", json=CHAT)
            assert resp.status_code == 200
            assert resp.headers["x-kvgate-worker"] == f"127.0.0.1:{good.port}"
        metrics = (await client.get(f"{base}/metrics")).text
    assert "kvgate_retries_total" in metrics


async def test_a_failure_with_nowhere_else_to_go_is_not_counted_as_a_retry() -> None:
    """``kvgate_retries_total`` counts attempts another worker took; one worker that fails is a 502 and no
    retry (it was counted as one, under ``connect``, whatever the failure)."""
    bad = FakeWorker("bad", mode="503")
    async with (
        running(bad),
        serving(settings_for(bad.url)) as base,
        httpx.AsyncClient(timeout=10) as client,
    ):
        resp = await client.post(f"{base}/v1/chat/completions", json=CHAT)
        assert resp.status_code >= 500
        metrics = (await client.get(f"{base}/metrics")).text
    assert not [line for line in metrics.splitlines() if line.startswith("kvgate_retries_total{")]


async def test_refused_connection_is_retried_elsewhere() -> None:
    gone, good = FakeWorker("gone"), FakeWorker("good")
    # Health checks too rare to notice: the proxy itself meets the refused connections.
    settings = settings_for(gone.url, good.url, health_interval_s=60)
    async with running(gone, good), serving(settings) as base, httpx.AsyncClient() as client:
        await gone.stop()
        statuses = [
            (await client.post(f"{base}/v1/chat/completions", json=CHAT)).status_code for _ in range(4)
        ]
    assert statuses == [200] * 4
    assert good.finished == 4


async def test_all_workers_failing_gives_openai_error() -> None:
    bad = FakeWorker("bad", mode="503")
    async with running(bad), serving(settings_for(bad.url)) as base, httpx.AsyncClient() as client:
        resp = await client.post(f"{base}/v1/chat/completions", json=CHAT)
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "worker_unavailable"


async def test_stream_relays_bytes_and_usage() -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with (
        running(FakeWorker("a")) as (a,),
        serving(settings_for(a.url)) as base,
        httpx.AsyncClient() as client,
        client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp,
    ):
        raw = b"".join([c async for c in resp.aiter_bytes()])
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["x-kvgate-worker"] == f"127.0.0.1:{a.port}"
    assert raw.count(b'"content":"tok') == 3
    assert b'"cached_tokens":4' in raw
    assert raw.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("mode", "code"), [("die_mid_stream", "worker_unavailable"), ("stall_mid_stream", "worker_timeout")]
)
async def test_worker_failing_mid_stream_ends_with_error_event(mode: str, code: str) -> None:
    body = {**CHAT, "stream": True}
    async with (
        running(FakeWorker("a", mode=mode)) as (a,),
        serving(settings_for(a.url)) as base,
        httpx.AsyncClient(timeout=10) as client,
        client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp,
    ):
        raw = b"".join([c async for c in resp.aiter_bytes()])
    frames = [f for f in raw.split(b"\n\n") if f]
    assert frames[-1] == b"data: [DONE]"
    error = orjson.loads(frames[-2][len(b"data: ") :])["error"]
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}


async def test_client_disconnect_cancels_upstream_and_releases_load() -> None:
    worker = FakeWorker("a", mode="slow_stream", chunks=200)
    body = {**CHAT, "stream": True}
    async with running(worker), serving(settings_for(worker.url)) as base, httpx.AsyncClient() as client:
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
            async for _chunk in resp.aiter_bytes():
                break
        await until(lambda: _true(worker.cancelled == 1))
        await until(lambda: _inflight_is(client, base, 0))
    assert worker.finished == 0


async def _true(value: bool) -> bool:
    return value


async def _inflight_is(client: httpx.AsyncClient, base: str, num: int) -> bool:
    return int((await client.get(f"{base}/admin/workers")).json()["workers"][0]["inflight"]) == num


async def test_client_leaving_a_non_streamed_request_cancels_upstream() -> None:
    worker = FakeWorker("a", mode="hang")
    slow_deadline = Timeouts(connect_s=1.0, ttfb_s=60.0, idle_s=60.0)  # only the disconnect can end it
    settings = settings_for(worker.url, timeouts=slow_deadline)
    async with running(worker), serving(settings) as base, httpx.AsyncClient() as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{base}/v1/chat/completions", json=CHAT, timeout=0.5)
        await until(lambda: _true(worker.cancelled == 1))
        await until(lambda: _inflight_is(client, base, 0))


@pytest.mark.parametrize("stream", [False, True])
async def test_the_worker_is_released_before_the_client_gets_the_answers_end(stream: bool) -> None:
    """A client's next request must not see its own finished request as the worker's load."""
    board = MemoryLoadBoard()
    worker = FakeWorker("a", linger_s=0.2)  # the stream's end arrives well after its [DONE]
    overrides = DepsOverrides(state=State(load=board))
    async with (
        running(worker),
        serving(settings_for(worker.url), overrides) as base,
        httpx.AsyncClient() as client,
    ):
        wid = f"127.0.0.1:{worker.port}"
        for _ in range(3):
            if stream:
                async with client.stream(
                    "POST", f"{base}/v1/chat/completions", json={**CHAT, "stream": True}
                ) as resp:
                    async for line in resp.aiter_lines():
                        if line.strip() == "data: [DONE]":
                            assert board.get(wid).inflight_requests == 0  # no await since the line arrived
            else:
                resp = await client.post(f"{base}/v1/chat/completions", json=CHAT)
                assert resp.status_code == 200
                assert board.get(wid).inflight_requests == 0


async def test_a_streams_first_chunk_tells_the_policy_its_prefill_is_done() -> None:
    """``WorkerView.prefill_tokens``: unknown until a stream's first chunk is seen; then the streaming
    request's tokens count as in flight but no longer as prefill ahead of a new request."""
    seen: list[tuple[int, int | None]] = []

    class Recording:
        name = "recording"
        needs: frozenset[Need] = frozenset()

        def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
            seen.append((workers[0].inflight_tokens, workers[0].prefill_tokens))
            return Decision(workers[0].id, reason="first")

    worker = FakeWorker("a", mode="slow_stream", chunks=20)
    overrides = DepsOverrides(policy=Recording())
    async with (
        running(worker),
        serving(settings_for(worker.url), overrides) as base,
        httpx.AsyncClient() as client,
    ):
        body = {**CHAT, "stream": True, "max_tokens": 100}
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
            lines = resp.aiter_lines()
            while not (await anext(lines)).startswith("data: "):
                pass
            answer = await client.post(f"{base}/v1/chat/completions", json={**CHAT, "max_tokens": 7})
            assert answer.status_code == 200
            async for _ in lines:
                pass
    (_, unknown), (inflight, prefill) = seen
    assert unknown is None  # no first token reported before the first request
    assert inflight >= 100  # the stream is in flight ...
    assert prefill == 0  # ... past its first token

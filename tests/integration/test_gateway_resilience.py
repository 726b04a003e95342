"""Failures with real processes: refused connections, a worker killed mid-stream, a client that leaves."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.gateway_fleet import Fleet, gateway_fleet
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

MODEL = "kvgate-sim"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a long story."}]
# ignore_eos (a vLLM extension the gateway forwards untouched) keeps the sim decoding to max_tokens.
CHAT = {"model": MODEL, "messages": MESSAGES, "ignore_eos": True}
IDLE_TIMEOUT_S = 2.0
# Rare health checks: the proxy itself must meet the failures, not the prober.
GATEWAY_ARGS = ("--policy", "round_robin", "--tokenizer", "none", "--health-interval-s", "60",
                "--idle-timeout-s", str(IDLE_TIMEOUT_S), "--connect-timeout-s", "1")  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    # Slow decoding so a stream is still running when the test acts on it.
    with gateway_fleet(tmp_path, worker_args=("--decode-tps", "20"), gateway_args=GATEWAY_ARGS) as f:
        yield f


def _kill(fleet: Fleet, worker: str) -> None:
    proc = fleet.workers[worker]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_refused_worker_is_routed_around(fleet: Fleet) -> None:
    _kill(fleet, next(iter(fleet.workers)))
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    for _ in range(6):
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        assert raw.headers["x-kvgate-worker"] == list(fleet.workers)[1]
        assert raw.parse().choices[0].message.content


def test_worker_killed_mid_stream_ends_stream_with_error_event(fleet: Fleet) -> None:
    body = {**CHAT, "max_tokens": 500, "stream": True}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{fleet.gateway}/v1/chat/completions", json=body) as resp,
    ):
        chunks = resp.iter_bytes()
        first = next(chunks)
        assert first.startswith(b"data: ")
        _kill(fleet, resp.headers["x-kvgate-worker"])
        killed_at = time.monotonic()
        rest = b"".join(chunks)
    assert time.monotonic() - killed_at < IDLE_TIMEOUT_S + 5
    frames = [f for f in rest.split(b"\n\n") if f]
    assert frames[-1] == b"data: [DONE]"
    error = orjson.loads(frames[-2][len(b"data: ") :])["error"]
    assert error["code"] in ("worker_unavailable", "worker_timeout")


def test_openai_client_sees_mid_stream_failure_as_error(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=500, stream=True, extra_body={"ignore_eos": True}
    )
    stream = raw.parse()
    chunks = iter(stream)
    next(chunks)
    _kill(fleet, raw.headers["x-kvgate-worker"])
    with pytest.raises(openai.APIError):
        for _chunk in chunks:
            pass


def test_client_disconnect_cancels_the_worker_request(fleet: Fleet) -> None:
    body = {**CHAT, "max_tokens": 2000, "stream": True}  # ~100 s of decoding at 20 tokens/s
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{fleet.gateway}/v1/chat/completions", json=body) as resp:
            worker = resp.headers["x-kvgate-worker"]
            chunks = resp.iter_bytes()  # keep a reference: a collected iterator closes the response
            next(chunks)
            wait_until(lambda: httpx.get(f"http://{worker}/load").json()["running"] == 1, timeout_s=10)
        wait_until(lambda: httpx.get(f"http://{worker}/load").json()["running"] == 0, timeout_s=10)
        inflight = {
            w["id"]: w["inflight"] for w in client.get(f"{fleet.gateway}/admin/workers").json()["workers"]
        }
    assert inflight[worker] == 0

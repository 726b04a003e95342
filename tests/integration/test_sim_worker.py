"""A real ``kvgate worker --sim`` process, driven by the official ``openai`` client and raw HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import openai
import orjson
import pytest

from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready, wait_until

pytestmark = pytest.mark.integration

SYSTEM = "You are kvgate's test assistant. Answer briefly and precisely, and never invent facts. " * 3
NUM_STREAMS = 1000


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "worker.log"
    args = [
        "--sim",
        "--port",
        str(port),
        "--decode-tps",
        "2000",
        "--prefill-tps",
        "1e6",
        "--max-running",
        "1024",
    ]
    proc = start_process(kvgate_cmd("worker", *args), log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{url}/health", logs=Path(log), timeout_s=30)
        yield url
    finally:
        stop_process(proc)
    # uvicorn re-raises SIGTERM after its graceful shutdown, so -15 is a clean exit too.
    text = Path(log).read_text()
    assert proc.returncode in (0, -15), text
    assert "Application shutdown complete" in text, text


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _tokens(url: str, question: str) -> list[int]:
    return list(httpx.post(f"{url}/tokenize", json={"messages": _messages(question)}).json()["tokens"])


def _expected_cached(first: list[int], second: list[int]) -> int:
    common = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(first))
    return min(common, len(second) - 1) // 16 * 16


def test_sync_client_gets_deterministic_text_usage_and_cached_prefix(worker: str):
    client = openai.OpenAI(base_url=f"{worker}/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(model="kvgate-sim", messages=_messages("What is a KV cache?"),
                                           max_tokens=20, seed=7)  # fmt: skip
    again = client.chat.completions.create(model="kvgate-sim", messages=_messages("What is a KV cache?"),
                                           max_tokens=20, seed=7)  # fmt: skip
    other = client.chat.completions.create(model="kvgate-sim", messages=_messages("And a prefix tree?"),
                                           max_tokens=20, seed=7)  # fmt: skip
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.choices[0].message.content
    assert first.usage is not None and other.usage is not None
    assert first.usage.completion_tokens == 20
    expected = _expected_cached(_tokens(worker, "What is a KV cache?"), _tokens(worker, "And a prefix tree?"))
    assert expected >= 64
    assert other.usage.prompt_tokens_details is not None
    assert other.usage.prompt_tokens_details.cached_tokens == expected


def test_sync_stream_matches_the_whole_response(worker: str):
    client = openai.OpenAI(base_url=f"{worker}/v1", api_key="unused", max_retries=0)
    kwargs = {"model": "kvgate-sim", "messages": _messages("Stream this."), "max_tokens": 15}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    stream = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})  # type: ignore[call-overload]
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 15
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


async def test_async_client_stream_and_completions(worker: str):
    client = openai.AsyncOpenAI(base_url=f"{worker}/v1", api_key="unused", max_retries=0)
    try:
        done = await client.completions.create(model="kvgate-sim", prompt="Once upon a time", max_tokens=6)
        assert done.usage is not None
        assert done.usage.completion_tokens == 6
        stream = await client.completions.create(model="kvgate-sim", prompt="Once upon a time", max_tokens=6,
                                                 stream=True)  # fmt: skip
        text = "".join([c.choices[0].text async for c in stream])
        assert text == done.choices[0].text
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model="kvgate-sim", prompt="x", max_tokens=6, n=9)
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="no-such-model", prompt="x")
    finally:
        await client.close()


def test_kv_events_deliver_stored_hashes_of_a_new_prompt(worker: str):
    question = "Which events does a worker publish?"
    expected = chain_hashes(_tokens(worker, question), root_hash("kvgate-sim"), 16)
    seen: set[int] = set()
    with httpx.Client(timeout=10) as http, http.stream("GET", f"{worker}/kv/events") as events:
        lines = events.iter_lines()
        snapshot = orjson.loads(next(lines).removeprefix("data: "))
        assert snapshot["type"] == "cleared"
        http.post(f"{worker}/v1/chat/completions",
                  json={"messages": _messages(question), "max_tokens": 2})  # fmt: skip
        for line in lines:
            if line.startswith("data: "):
                event = orjson.loads(line.removeprefix("data: "))
                if event["type"] == "stored":
                    seen.update(event["hashes"])
            if set(expected) <= seen:
                break
    assert set(expected) <= seen
    load = httpx.get(f"{worker}/load").json()
    assert load["num_cached_blocks"] >= len(expected)


async def _one_stream(http: aiohttp.ClientSession, url: str, i: int) -> tuple[int, bool]:
    body = {"prompt": f"stream number {i} " * 4, "max_tokens": 8, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        frames = [line for line in (await resp.text()).split("\n\n") if line.startswith("data: ")]
    usage = orjson.loads(frames[-2].removeprefix("data: "))["usage"]
    return usage["completion_tokens"], frames[-1] == "data: [DONE]"


async def test_a_thousand_concurrent_streams_complete(worker: str):
    # aiohttp rather than httpx: the client, not the worker, is the bottleneck on this machine.
    connector = aiohttp.TCPConnector(limit=NUM_STREAMS)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=90)) as http:
        results = await asyncio.wait_for(
            asyncio.gather(*(_one_stream(http, worker, i) for i in range(NUM_STREAMS))), timeout=100
        )
        async with http.get(f"{worker}/load") as resp:
            load = orjson.loads(await resp.read())
    assert results == [(8, True)] * NUM_STREAMS
    assert (load["running"], load["waiting"], load["kv_usage"]) == (0, 0, 0.0)


def test_client_disconnect_aborts_the_sequence(worker: str):
    body = {"prompt": "a long story", "max_tokens": 30000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=worker, timeout=10) as http:
        with http.stream("POST", "/v1/completions", json=body) as resp:
            lines = resp.iter_lines()  # keep it referenced: dropping it closes the response
            assert next(lines).startswith("data: ")
            assert http.get("/load").json()["running"] >= 1
        # Leaving the block closed the connection mid-stream: the worker must drop the sequence.
        wait_until(lambda: http.get("/load").json()["running"] == 0, timeout_s=10)
        assert http.get("/load").json()["kv_usage"] == 0.0

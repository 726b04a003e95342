"""A real gateway in front of a vLLM-like server: cached_tokens feedback on streams whose client did not ask
for usage (the gateway asks the engine itself and drops the extra usage chunk before the client)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
CACHED = 48
DOC = "The quick brown fox jumps over the lazy dog. " * 20  # many 16-byte blocks for the byte tokenizer


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


def test_stream_without_include_usage_feeds_cached_tokens_but_shows_no_usage(tmp_path: Path) -> None:
    engine_port, gw_port = free_port(), free_port()
    engine = start_process(
        [
            sys.executable,
            "-m",
            "tests.support.fake_vllm",
            "--port",
            str(engine_port),
            "--cached-tokens",
            str(CACHED),
        ],
        log=tmp_path / "engine.log",
    )
    procs = [engine]
    try:
        wait_ready(engine, f"http://127.0.0.1:{engine_port}/health", logs=tmp_path / "engine.log")
        worker = f"--worker=http://127.0.0.1:{engine_port}#id=vllm-0&engine=vllm"
        gw = start_process(
            kvgate_cmd(
                "gateway", "--port", str(gw_port), "--tokenizer", "bytes", "--kv-index", "approximate", worker
            ),
            log=tmp_path / "gateway.log",
        )
        procs.append(gw)
        base = f"http://127.0.0.1:{gw_port}"
        wait_ready(gw, base + "/ready", logs=tmp_path / "gateway.log")
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": DOC},
            {"role": "user", "content": "Summarise."},
        ]
        hits = []
        for _ in range(2):
            raw = client.chat.completions.with_raw_response.create(
                model="fake-vllm", messages=messages, stream=True
            )
            assert raw.headers["x-kvgate-worker"] == "vllm-0"
            hits.append(int(raw.headers["x-kvgate-prefix-hit"]))
            chunks: list[ChatCompletionChunk] = list(raw.parse())
            assert (
                "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello from a vLLM-like server."
            )
            assert all(c.usage is None and c.choices for c in chunks)  # no usage chunk reached this client
        asked = list(client.chat.completions.create(
            model="fake-vllm", messages=messages, stream=True, stream_options={"include_usage": True}
        ))  # fmt: skip
        metrics = httpx.get(base + "/metrics", timeout=10).text
        seen = httpx.get(f"http://127.0.0.1:{engine_port}/_seen", timeout=10).json()
    finally:
        for proc in reversed(procs):
            stop_process(proc)
    assert seen == [{"include_usage": True}] * 3  # injected twice, the client's own once
    last = asked[-1]
    assert last.choices == [] and last.usage is not None  # a client that asked still gets it
    assert last.usage.prompt_tokens_details is not None
    assert last.usage.prompt_tokens_details.cached_tokens == CACHED
    assert hits[0] == 0 and hits[1] > 0  # the approximate index predicted the repeat
    assert _metric(metrics, "kvgate_prefix_unreported_requests_total") == 0
    assert _metric(metrics, "kvgate_prefix_reported_cached_tokens_count") == 3
    assert _metric(metrics, "kvgate_prefix_reported_cached_tokens_sum") == 3 * CACHED
    assert _metric(metrics, "kvgate_prefix_realised_tokens_total") == 2 * min(hits[1], CACHED)

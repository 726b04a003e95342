"""Real ``kvgate worker --sim --foreign`` processes: an engine a gateway cannot see inside, alone and behind a
gateway started with nothing but ``--worker URL``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.foreign import foreign_workers
from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "kvgate-sim"
SYSTEM = " ".join(f"rule{i} applies here" for i in range(30))  # 90 words


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with foreign_workers(tmp_path_factory.mktemp("foreign")) as urls:
        yield urls


def _chat(question: str, **extra: object) -> dict[str, object]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": 8, **extra}


def _rendered_words(body: dict[str, object]) -> int:
    """Whitespace words of the foreign template's rendering: ``role: content`` lines, then ``assistant:``."""
    messages = body["messages"]
    assert isinstance(messages, list)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return len(text.split())


def test_introspection_routes_are_404_and_the_card_is_not_kvgate(workers: list[str]) -> None:
    url = workers[0]
    for path in ("/kv/events", "/kv/blocks", "/tokenizer", "/load"):
        reply = httpx.get(url + path, timeout=5)
        assert reply.status_code == 404, (path, reply.text)
        assert "error" in reply.json()
    assert httpx.post(url + "/tokenize", json={"prompt": "hi"}, timeout=5).status_code == 404
    card = httpx.get(url + "/v1/models", timeout=5).json()["data"][0]
    assert card["id"] == MODEL
    assert card["owned_by"] not in ("kvgate", "vllm", "sglang")


def test_usage_is_in_words_and_a_repeat_is_cached_in_whole_blocks(workers: list[str]) -> None:
    url = workers[0]
    body = _chat("what is cached when the same long prompt comes again today")
    first = httpx.post(url + "/v1/chat/completions", json=body, timeout=30).json()["usage"]
    again = httpx.post(url + "/v1/chat/completions", json=body, timeout=30).json()["usage"]
    words = _rendered_words(body)
    assert first["prompt_tokens"] == again["prompt_tokens"] == words
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached == (words - 1) // 16 * 16 > 0  # whole 16-word blocks, never the last token


def test_streamed_final_usage_chunk_carries_cached_tokens(workers: list[str]) -> None:
    url = workers[1]
    body = _chat("and streamed twice", stream=True, stream_options={"include_usage": True})
    usages = []
    for _ in range(2):
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        chunks = [orjson.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
        usages.append(chunks[-1]["usage"])
    assert usages[0]["prompt_tokens"] == _rendered_words(body)
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] == (_rendered_words(body) - 1) // 16 * 16


def test_zero_config_gateway_is_generic_openai_on_bytes(workers: list[str], tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    flags = [a for url in workers for a in ("--worker", url)]
    proc = start_process(kvgate_cmd("gateway", "--port", str(port), *flags), log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, base + "/ready", logs=log, timeout_s=60)
        reply = httpx.post(base + "/v1/chat/completions", json=_chat("through the gateway"), timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]

        def detected() -> bool:
            rows = httpx.get(base + "/admin/workers", timeout=5).json()["workers"]
            return [w["engine"]["kind"] for w in rows] == ["openai", "openai"]

        wait_until(detected, timeout_s=20)
        text = log.read_text()
        assert "no exact tokenizer" in text and "byte tokenizer" in text, text
    finally:
        stop_process(proc)


def test_the_gateway_learns_the_workers_units_and_predicts_in_its_tokens(
    workers: list[str], tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    flags = [a for url in workers for a in ("--worker", url + "#kv_tokens=4096")]
    proc = start_process(kvgate_cmd("gateway", "--port", str(port), *flags), log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, base + "/ready", logs=log, timeout_s=60)
        body = _chat(" ".join(f"question{i} about units" for i in range(40)))  # ~220 words, ~1.5 KB
        for _ in range(3):
            reply = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
            assert reply.status_code == 200, reply.text
        predicted = int(reply.headers["x-kvgate-prefix-hit"])
        cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 100
        # the prediction is counted in the worker's words (in whole 16-word blocks), not in the gateway's bytes
        assert abs(predicted - cached) <= 16, (predicted, cached)

        rows = {w["id"]: w for w in httpx.get(base + "/admin/workers", timeout=5).json()["workers"]}
        units = rows[reply.headers["x-kvgate-worker"]]["engine"]["units"]
        ratio = units["gateway_tokens_per_engine_token"]
        assert 4 < ratio < 12, units  # bytes per whitespace word, learned from usage.prompt_tokens
        assert units["usage_samples"] >= 1
        found = re.search(r"\((\d+)-byte blocks\)", log.read_text())  # the start-up probe's block size
        assert found is not None, log.read_text()
        block = int(found.group(1))
        expected = 4096 * ratio * units["capacity_scale"] / block  # the worker's 4,096 words in byte blocks
        assert abs(units["assumed_capacity_blocks"] - expected) <= 0.05 * expected, units
    finally:
        stop_process(proc)

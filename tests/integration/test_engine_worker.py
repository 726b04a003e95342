"""A real ``kvgate worker --model tiny`` process (the torch engine) driven by the ``openai`` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready, wait_until

pytestmark = pytest.mark.integration

MODEL = "kvgate-tiny"
SYSTEM = "You are a terse assistant of the kvgate test suite. " * 2


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "worker.log"
    args = ["--model", "tiny", "--device", "cpu", "--port", str(port), "--kv-tokens", "8192"]
    proc = start_process(kvgate_cmd("worker", *args), log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{url}/health", logs=Path(log))
        yield url
    finally:
        stop_process(proc)
    assert proc.returncode in (0, -15), Path(log).read_text()


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def _tokens(url: str, question: str) -> list[int]:
    return list(httpx.post(f"{url}/tokenize", json={"messages": _messages(question)}).json()["tokens"])


def test_greedy_chat_is_deterministic_and_reports_the_cached_prefix(worker: str) -> None:
    client = _client(worker)
    first = client.chat.completions.create(
        model=MODEL, messages=_messages("Hi?"), max_tokens=8, temperature=0
    )
    again = client.chat.completions.create(
        model=MODEL, messages=_messages("Hi?"), max_tokens=8, temperature=0
    )
    other = client.chat.completions.create(
        model=MODEL, messages=_messages("Bye?"), max_tokens=8, temperature=0
    )
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.usage is not None and other.usage is not None
    assert 1 <= first.usage.completion_tokens <= 8
    a, b = _tokens(worker, "Hi?"), _tokens(worker, "Bye?")
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert common >= 32
    assert other.usage.prompt_tokens_details is not None
    assert other.usage.prompt_tokens_details.cached_tokens == common // 16 * 16


def test_streamed_completion_carries_usage(worker: str) -> None:
    stream = _client(worker).completions.create(
        model=MODEL, prompt="kvgate", max_tokens=6, temperature=0.8, seed=3, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage is not None
    assert 1 <= chunks[-1].usage.completion_tokens <= 6
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")


def test_context_too_long_is_an_openai_error(worker: str) -> None:
    with pytest.raises(openai.BadRequestError):
        _client(worker).completions.create(model=MODEL, prompt="x", max_tokens=100_000)


def test_client_disconnect_frees_the_sequence(worker: str) -> None:
    body = {"model": MODEL, "prompt": "long story", "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{worker}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        load = httpx.get(f"{worker}/load").json()
        assert (load["running"], load["waiting"]) == (1, 0), load
        assert load["kv_usage"] > 0

    def idle() -> bool:
        load = httpx.get(f"{worker}/load").json()
        return bool(load["running"] == 0 and load["kv_usage"] == 0)

    wait_until(idle, timeout_s=30)

"""The Responses API, embeddings, ``n > 1`` and media parts on real worker processes (sim and torch engine),
driven by the official ``openai`` client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

INSTRUCTIONS = "You are the terse assistant of kvgate's test suite; answer in one short line. " * 2
TINY_VOCAB = 259  # the tiny model's byte vocabulary: stopping on any id ends a greedy answer at once


@dataclass(frozen=True)
class Worker:
    kind: str  # "sim" or "engine"
    url: str
    model: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)

    def finishing(self) -> dict[str, Any]:
        """Arguments that make a response end by itself (status ``completed``) quickly."""
        if self.kind == "sim":
            return {}  # the sim stops at its natural length (at most 256 tokens, fast here)
        return {"extra_body": {"stop_token_ids": list(range(TINY_VOCAB))}}


_ARGS = {
    "sim": ["--sim", "--decode-tps", "5000", "--prefill-tps", "1e6"],
    "engine": ["--model", "tiny", "--device", "cpu", "--kv-tokens", "8192"],
}


@pytest.fixture(scope="module", params=["sim", "engine"])
def worker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    kind: str = request.param
    port = free_port()
    log = tmp_path_factory.mktemp(kind) / "worker.log"
    proc = start_process(kvgate_cmd("worker", *_ARGS[kind], "--port", str(port)), log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{url}/health", logs=Path(log), timeout_s=60)
        yield Worker(kind, url, "kvgate-sim" if kind == "sim" else "kvgate-tiny")
    finally:
        stop_process(proc)
    assert proc.returncode in (0, -15), Path(log).read_text()


def _token_count(worker: Worker, messages: list[dict[str, str]]) -> int:
    return int(httpx.post(f"{worker.url}/tokenize", json={"messages": messages}).json()["count"])


def test_responses_create_answers_a_response_object(worker: Worker) -> None:
    resp = worker.client().responses.create(
        model=worker.model,
        input="What is a KV cache?",
        instructions=INSTRUCTIONS,
        max_output_tokens=8,
        temperature=0,
    )
    assert resp.id.startswith("resp_")
    assert resp.object == "response"
    assert resp.status in ("completed", "incomplete")
    assert resp.output[0].type == "message"
    assert resp.usage is not None
    assert 1 <= resp.usage.output_tokens <= 8
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    messages = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "What is a KV cache?"},
    ]
    assert resp.usage.input_tokens == _token_count(worker, messages)
    if resp.status == "incomplete":
        assert resp.incomplete_details is not None
        assert resp.incomplete_details.reason == "max_output_tokens"


def test_responses_stream_sends_openai_events_in_order(worker: Worker) -> None:
    stream = worker.client().responses.create(
        model=worker.model, input="Stream please", max_output_tokens=6, temperature=0, stream=True
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert set(kinds[4:-4]) <= {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == deltas
    assert final.usage is not None and final.usage.output_tokens <= 6


def test_stream_helper_gets_the_final_response(worker: Worker) -> None:
    with worker.client().responses.stream(
        model=worker.model, input="Tell me something.", temperature=0, **worker.finishing()
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens >= 1


def test_previous_response_id_chain_renders_the_whole_conversation(worker: Worker) -> None:
    client = worker.client()
    questions = ["First question: what is a prefix cache?", "Second: and a block?", "Third: thanks!"]
    history: list[dict[str, str]] = [{"role": "system", "content": INSTRUCTIONS}]
    previous = None
    for question in questions:
        resp = client.responses.create(
            model=worker.model,
            input=question,
            instructions=INSTRUCTIONS,
            max_output_tokens=8,
            temperature=0,
            previous_response_id=previous,
        )
        history.append({"role": "user", "content": question})
        assert resp.usage is not None
        assert resp.usage.input_tokens == _token_count(worker, history)
        history.append({"role": "assistant", "content": resp.output_text})
        previous = resp.id
    assert resp.previous_response_id is not None and resp.usage is not None
    alone = _token_count(worker, [history[0], history[-2]])  # the third turn without its history
    assert resp.usage.input_tokens > alone + 20
    assert resp.usage.input_tokens_details.cached_tokens > 0  # the earlier turns' blocks were reused


def test_retrieve_and_delete_a_stored_response(worker: Worker) -> None:
    client = worker.client()
    resp = client.responses.create(model=worker.model, input="Remember me", max_output_tokens=4)
    got = client.responses.retrieve(resp.id)
    assert (got.id, got.output_text) == (resp.id, resp.output_text)
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.BadRequestError):  # only background responses can be cancelled
        client.responses.cancel(
            client.responses.create(model=worker.model, input="x", max_output_tokens=2).id
        )


def test_unknown_previous_response_id_is_not_found(worker: Worker) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        worker.client().responses.create(
            model=worker.model, input="hi", previous_response_id="resp_unknown", max_output_tokens=2
        )
    assert info.value.code == "previous_response_not_found"
    assert info.value.param == "previous_response_id"


def test_embeddings_float_and_base64_agree_and_are_normalised(worker: Worker) -> None:
    client = worker.client()
    texts = ["the prefix cache", "the prefix cache", "a completely different sentence"]
    floats = client.embeddings.create(model=worker.model, input=texts, encoding_format="float")
    decoded = client.embeddings.create(model=worker.model, input=texts)  # the SDK asks for base64
    a = np.array([d.embedding for d in floats.data])
    b = np.array([d.embedding for d in decoded.data])
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert a.shape == b.shape and a.shape[1] >= 16
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(a[0], a[1], atol=1e-6)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0


def test_chat_with_three_choices(worker: Worker) -> None:
    client = worker.client()
    messages: Any = [{"role": "user", "content": "Give me three answers."}]
    whole = client.chat.completions.create(
        model=worker.model,
        messages=messages,
        n=3,
        max_tokens=4,
        seed=5,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens == _token_count(worker, messages)
    chunks = list(
        client.chat.completions.create(
            model=worker.model,
            messages=messages,
            n=3,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1, 2}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_image_parts_are_the_sims_text_and_the_engines_error(worker: Worker) -> None:
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    messages: Any = [{"role": "user", "content": content}]
    client = worker.client()
    if worker.kind == "sim":
        resp = client.chat.completions.create(model=worker.model, messages=messages, max_tokens=3)
        assert resp.usage is not None and resp.usage.prompt_tokens > 20  # the marker was rendered
        return
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=worker.model, messages=messages, max_tokens=3)
    assert info.value.param == "messages"
    assert "text only" in str(info.value)

"""The whole OpenAI surface through real gateways in front of real sim workers, driven by the real clients:
the ``openai`` SDK (Responses API with a ``previous_response_id`` chain across two gateway replicas sharing
Redis, embeddings, a vision message, ``n > 1``) and LangChain's ``ChatOpenAI`` and ``OpenAIEmbeddings``."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from pydantic import SecretStr

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.redis, pytest.mark.timeout(180)]
MODEL = "kvgate-sim"
_FAST = ("--decode-tps", "5000", "--prefill-tps", "1e6")


@dataclass
class TwoGateways:
    urls: tuple[str, str]
    workers: tuple[str, ...]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[TwoGateways]:
    """Three sim workers and two gateway replicas on one Redis (default policy and tokenizer)."""
    logs = tmp_path_factory.mktemp("openai-routes")
    redis_url = redis_server.url
    procs: list[subprocess.Popen[bytes]] = []
    with ExitStack() as stack:

        @stack.callback
        def _stop() -> None:
            for proc in reversed(procs):
                stop_process(proc)

        workers = []
        for i in range(3):
            port = free_port()
            proc = start_process(
                kvgate_cmd("worker", "--sim", "--port", str(port), *_FAST), log=logs / f"worker{i}.log"
            )
            procs.append(proc)
            workers.append(f"127.0.0.1:{port}")
            wait_ready(proc, f"http://127.0.0.1:{port}/health", logs=logs)
        urls = []
        for i in range(2):
            port = free_port()
            args = ["--port", str(port), "--state", redis_url, *(f"--worker=http://{w}" for w in workers)]
            proc = start_process(kvgate_cmd("gateway", *args), log=logs / f"gateway{i}.log")
            procs.append(proc)
            wait_ready(proc, f"http://127.0.0.1:{port}/ready", logs=logs)
            urls.append(f"http://127.0.0.1:{port}")
        yield TwoGateways((urls[0], urls[1]), tuple(workers))


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30.0)


def test_a_responses_chain_stays_on_its_worker_across_replicas(fleet: TwoGateways) -> None:
    clients = [_client(u) for u in fleet.urls]
    raw = clients[0].responses.with_raw_response.create(
        model=MODEL, instructions="Answer briefly.", input="Name a colour.", max_output_tokens=8
    )
    first = raw.parse()
    owner = raw.headers["x-kvgate-worker"]
    assert first.usage is not None
    assert first.output_text and first.status in ("completed", "incomplete")
    previous, inputs = first.id, [first.usage.input_tokens]
    for turn in range(4):  # alternate replicas: the owner record is shared through Redis
        raw = clients[(turn + 1) % 2].responses.with_raw_response.create(
            model=MODEL,
            input=f"And another one ({turn})?",
            previous_response_id=previous,
            max_output_tokens=8,
        )
        resp = raw.parse()
        assert raw.headers["x-kvgate-worker"] == owner and resp.usage is not None
        assert resp.previous_response_id == previous
        previous = resp.id
        inputs.append(resp.usage.input_tokens)
    assert inputs == sorted(inputs) and inputs[-1] > inputs[0] + 20  # each turn carried the history
    got = clients[1].responses.retrieve(previous)
    assert got.id == previous and got.output_text
    clients[0].responses.delete(previous)
    with pytest.raises(openai.NotFoundError):
        clients[1].responses.retrieve(previous)
    with pytest.raises(openai.NotFoundError):
        clients[1].responses.create(model=MODEL, input="hi", previous_response_id="resp_does_not_exist")


def test_responses_stream_through_the_sdk_helper(fleet: TwoGateways) -> None:
    client = _client(fleet.urls[1])
    with client.responses.stream(model=MODEL, input="Count to five.") as stream:  # the sim ends by itself
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas and "".join(deltas) == final.output_text
    assert final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens > 0
    follow = client.responses.create(
        model=MODEL, input="Go on.", previous_response_id=final.id, max_output_tokens=4
    )
    assert follow.previous_response_id == final.id


def test_embeddings_through_the_sdk(fleet: TwoGateways) -> None:
    client = _client(fleet.urls[0])
    floats = client.embeddings.create(
        model=MODEL, input=["a red fox", "a red fox", "blue sky"], encoding_format="float"
    )
    vectors = [d.embedding for d in floats.data]
    assert len(vectors) == 3 and len({len(v) for v in vectors}) == 1
    assert vectors[0] == vectors[1] != vectors[2]
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-4) for v in vectors)
    packed = client.embeddings.create(model=MODEL, input="a red fox")  # the SDK asks for base64 and decodes
    assert packed.data[0].embedding == pytest.approx(vectors[0], rel=1e-5)


def test_a_vision_message_and_n_choices_through_the_sdk(fleet: TwoGateways) -> None:
    client = _client(fleet.urls[0])
    text = "Describe this picture for a catalogue, with its colours, its mood and its likely subject. " * 3

    def ask(url: str) -> Mapping[str, str]:
        content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
        messages: Any = [{"role": "user", "content": content}]
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=4)
        assert raw.parse().choices[0].message.content is not None
        return raw.headers

    cat = "data:image/png;base64," + "Q0FU" * 64
    first = ask(cat)
    again = ask(cat)  # the same text and image: the worker that has it is predicted to hold the prefix
    assert again["x-kvgate-worker"] == first["x-kvgate-worker"]
    assert int(again["x-kvgate-prefix-hit"]) > 0
    choices = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], n=3, max_tokens=4
    ).choices
    assert sorted(c.index for c in choices) == [0, 1, 2]


def test_langchain_chat_and_embeddings(fleet: TwoGateways) -> None:
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    chat = ChatOpenAI(
        model=MODEL,
        base_url=fleet.urls[1] + "/v1",
        api_key=SecretStr("unused"),
        max_completion_tokens=6,
        max_retries=0,
    )
    assert isinstance(chat.invoke("Say hello.").content, str)
    pieces = [chunk.content for chunk in chat.stream("Say hello again.")]
    assert len(pieces) > 1
    batch = chat.batch(["one", "two", "three"])
    assert len(batch) == 3 and all(isinstance(m.content, str) for m in batch)
    embeddings = OpenAIEmbeddings(
        model=MODEL, base_url=fleet.urls[0] + "/v1", api_key=SecretStr("unused"), check_embedding_ctx_length=False,
        max_retries=0,
    )  # fmt: skip
    docs = embeddings.embed_documents(["a red fox", "blue sky"])
    assert len(docs) == 2 and len(docs[0]) == len(docs[1]) > 0
    assert embeddings.embed_query("a red fox") == pytest.approx(docs[0], rel=1e-5)

"""The official ``openai`` client (sync and async, streaming and not) through a real gateway to sim workers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.gateway_fleet import Fleet, gateway_fleet

pytestmark = pytest.mark.integration

MODEL = "kvgate-sim"
SYSTEM = "You are kvgate's integration-test assistant. Keep answers short, exact and friendly. " * 4
GATEWAY_ARGS = ("--health-interval-s", "0.5")  # the defaults: prefix_cache_aware, tokenizer from the workers


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    worker_args = ("--prefill-tps", "1000000", "--decode-tps", "2000")
    with gateway_fleet(
        tmp_path_factory.mktemp("gw"), worker_args=worker_args, gateway_args=GATEWAY_ARGS
    ) as f:
        yield f


def _messages(question: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def test_sync_client_content_usage_cached_tokens_and_worker_header(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    replies = [
        client.chat.completions.with_raw_response.create(
            model=MODEL, messages=_messages("What is a KV cache?"), max_tokens=12, seed=3
        )
        for _ in range(2)
    ]
    first, second = (r.parse() for r in replies)
    assert first.choices[0].message.content
    assert first.usage is not None and first.usage.completion_tokens == 12
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The default policy (prefix_cache_aware) sends the repeat to the worker holding the prefix, and the
    # gateway's prediction (x-kvgate-prefix-hit) is what the worker reports as cached.
    assert replies[1].headers["x-kvgate-worker"] == replies[0].headers["x-kvgate-worker"] in fleet.workers
    assert cached is not None and cached >= 64
    assert int(replies[1].headers["x-kvgate-prefix-hit"]) == cached


def test_sync_stream_with_usage(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    whole = client.chat.completions.create(
        model=MODEL, messages=_messages("Stream it."), max_tokens=10, seed=1
    )
    stream = client.chat.completions.create(
        model=MODEL, messages=_messages("Stream it."), max_tokens=10, seed=1, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 10
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens is not None


async def test_async_client_streaming_and_not(fleet: Fleet) -> None:
    async with openai.AsyncOpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0) as client:
        reply = await client.chat.completions.create(model=MODEL, messages=_messages("Async?"), max_tokens=8)
        stream = await client.chat.completions.create(
            model=MODEL, messages=_messages("Async?"), max_tokens=8, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        completion = await client.completions.create(model=MODEL, prompt=[1, 2, 3, 4, 5], max_tokens=4)
    assert reply.choices[0].message.content
    assert text == reply.choices[0].message.content
    assert completion.usage is not None and completion.usage.prompt_tokens == 5


def test_models_lists_the_workers_models(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]


def test_bad_input_through_the_client(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="no-such-model", messages=_messages("x"))
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=_messages("x"), max_tokens=-5)
    assert not_found.value.code == "model_not_found"
    assert bad.value.param == "max_tokens"
    malformed = httpx.post(f"{fleet.gateway}/v1/chat/completions", content=b"{oops",
                           headers={"content-type": "application/json"})  # fmt: skip
    assert malformed.status_code == 400
    assert set(malformed.json()["error"]) == {"message", "type", "param", "code"}

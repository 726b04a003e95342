"""``n > 1`` on chat and completions: n choices sharing the prompt, indexed chunks, summed usage."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

MESSAGES = [{"role": "user", "content": "Give me a few different answers, please. " * 3}]


def _frames(text: str) -> list[dict[str, Any]]:
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    return [orjson.loads(f) for f in frames[:-1]]


async def test_chat_answers_n_choices_with_their_indices_and_summed_usage(
    sim_client: httpx.AsyncClient,
) -> None:
    body = {"messages": MESSAGES, "n": 3, "max_tokens": 5, "seed": 4, "ignore_eos": True}
    resp = (await sim_client.post("/v1/chat/completions", json=body)).json()
    assert [c["index"] for c in resp["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in resp["choices"]]
    assert len(set(texts)) == 3  # seeds 4, 5, 6
    single = (await sim_client.post("/v1/chat/completions", json={**body, "n": 1})).json()
    assert single["choices"][0]["message"]["content"] == texts[0]
    usage = resp["usage"]
    assert usage["completion_tokens"] == 15
    assert usage["prompt_tokens"] == single["usage"]["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + 15


async def test_streamed_choices_carry_their_index(sim_client: httpx.AsyncClient) -> None:
    body = {"messages": MESSAGES, "n": 2, "max_tokens": 4, "seed": 1, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    chunks = _frames((await sim_client.post("/v1/chat/completions", json=body)).text)
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert roles == [0, 1]
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in chunks[:-1]:
        choice = chunk["choices"][0]
        texts[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"]:
            finished.add(choice["index"])
    assert finished == {0, 1}
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    whole = (await sim_client.post("/v1/chat/completions", json={**body, "stream": False})).json()
    assert [c["message"]["content"] for c in whole["choices"]] == [texts[0], texts[1]]


async def test_completions_answer_n_choices(sim_client: httpx.AsyncClient) -> None:
    body = {"prompt": "once upon a time", "n": 2, "max_tokens": 3}
    resp = (await sim_client.post("/v1/completions", json=body)).json()
    assert [c["index"] for c in resp["choices"]] == [0, 1]
    assert all("text" in c for c in resp["choices"])
    assert resp["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("n", [0, 9, "2", 1.5], ids=["zero", "above-bound", "string", "float"])
async def test_n_out_of_bounds_is_a_400(sim_client: httpx.AsyncClient, n: object) -> None:
    resp = await sim_client.post("/v1/chat/completions", json={"messages": MESSAGES, "n": n})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "n"

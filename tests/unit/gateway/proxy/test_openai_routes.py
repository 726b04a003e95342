"""The routes beyond chat, through the gateway: the Responses API (sticky by ``previous_response_id``, its
stored-response routes), embeddings and the pass-through routes (load-balanced), fields forwarded untouched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest

from tests.unit.gateway.fake_worker import FakeWorker, running as running_chat
from tests.unit.gateway.gateway_harness import serving, settings_for, until
from tests.unit.gateway.proxy.openai_worker import OpenAIWorker, running

pytestmark = pytest.mark.timeout(30)


async def _ready(client: httpx.AsyncClient, n: int) -> None:
    async def all_up() -> bool:
        workers = (await client.get("/admin/workers")).json()["workers"]
        return sum(1 for w in workers if w["healthy"] and w["models"]) == n

    await until(all_up)


@asynccontextmanager
async def gateway(
    *workers: OpenAIWorker, **overrides: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, tuple[OpenAIWorker, ...]]]:
    """The workers and a gateway in front of them (ready); yields a client of the gateway."""
    settings = settings_for(*(w.url for w in workers), **overrides)
    async with running(*workers) as ws, serving(settings) as base, httpx.AsyncClient(base_url=base) as client:
        await _ready(client, len(ws))
        yield client, ws


async def test_follow_ups_go_to_the_worker_that_stored_the_response() -> None:
    async with gateway(*(OpenAIWorker(f"w{i}") for i in range(3))) as (c, _workers):
        first = await c.post("/v1/responses", json={"model": "m1", "input": "hello"})
        assert first.status_code == 200, first.text
        owner, previous = first.headers["x-kvgate-worker"], first.json()["id"]
        for turn in range(4):  # round robin would rotate: the id pins them
            body = {"model": "m1", "input": f"turn {turn}", "previous_response_id": previous}
            resp = await c.post("/v1/responses", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-kvgate-worker"] == owner
            previous = resp.json()["id"]
        fresh = {(await c.post("/v1/responses", json={"model": "m1", "input": "x"})).headers["x-kvgate-worker"]
                     for _ in range(3)}  # fmt: skip
        assert len(fresh) == 3  # requests without an id are placed by the policy


async def test_a_streamed_response_is_relayed_as_sent_and_its_id_pins_the_next_turn() -> None:
    async with gateway(OpenAIWorker("w0"), OpenAIWorker("w1")) as (c, _workers):
        body = {"model": "m1", "input": [{"role": "user", "content": "hi"}], "stream": True}
        resp = await c.post("/v1/responses", json=body)
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [e for e in resp.content.split(b"\n\n") if e]
        assert events[0].startswith(b"event: response.created")
        assert events[-1].startswith(b"event: response.completed")
        assert b"[DONE]" not in resp.content
        created = orjson.loads(events[0].split(b"data: ", 1)[1])["response"]["id"]
        follow = await c.post(
            "/v1/responses", json={"model": "m1", "input": "and?", "previous_response_id": created}
        )
        assert follow.status_code == 200
        assert follow.headers["x-kvgate-worker"] == resp.headers["x-kvgate-worker"]


async def test_a_responses_stream_cut_short_ends_with_an_error_event() -> None:
    async with gateway(OpenAIWorker("w0", mode="die_mid_stream")) as (c, _workers):
        resp = await c.post("/v1/responses", json={"model": "m1", "input": "hi", "stream": True})
        assert resp.status_code == 200
        last = [e for e in resp.content.split(b"\n\n") if e][-1]
        assert last.startswith(b"event: error\n")
        assert orjson.loads(last.split(b"data: ", 1)[1])["type"] == "error"


async def test_an_id_no_worker_holds_is_404_and_one_made_elsewhere_is_found() -> None:
    async with gateway(OpenAIWorker("w0"), OpenAIWorker("w1")) as (c, workers):
        body = {"model": "m1", "input": "hi", "previous_response_id": "resp_nobody"}
        resp = await c.post("/v1/responses", json=body)
        assert resp.status_code == 404
        error = resp.json()["error"]
        assert error["param"] == "previous_response_id" and "resp_nobody" in error["message"]
        assert not any(w.seen("/v1/responses") for w in workers)  # never answered without its history
        # a response created on w1 directly (not through this gateway): the fleet is asked, w1 has it
        async with httpx.AsyncClient(base_url=workers[1].url) as direct:
            made = (await direct.post("/v1/responses", json={"model": "m1", "input": "direct"})).json()["id"]
        for _ in range(3):
            resp = await c.post("/v1/responses", json={**body, "previous_response_id": made})
            assert resp.status_code == 200
            assert resp.headers["x-kvgate-worker"] == workers[1].url.removeprefix("http://")


async def test_stored_response_routes_reach_its_worker_and_delete_forgets_it() -> None:
    async with gateway(OpenAIWorker("w0"), OpenAIWorker("w1")) as (c, workers):
        made = [(await c.post("/v1/responses", json={"model": "m1", "input": f"{i}"})) for i in range(2)]
        for resp in made:
            rid, owner = resp.json()["id"], resp.headers["x-kvgate-worker"]
            got = await c.get(f"/v1/responses/{rid}")
            assert got.status_code == 200 and got.json()["id"] == rid
            assert got.headers["x-kvgate-worker"] == owner
            items = await c.get(f"/v1/responses/{rid}/input_items", params={"limit": 5})
            assert items.status_code == 200 and items.headers["x-kvgate-worker"] == owner
            cancel = await c.post(f"/v1/responses/{rid}/cancel")
            assert cancel.status_code == 400  # the engine's own answer, relayed
            deleted = await c.delete(f"/v1/responses/{rid}")
            assert deleted.status_code == 200 and deleted.json()["deleted"] is True
            again = await c.get(f"/v1/responses/{rid}")
            assert again.status_code == 404
        seen = workers[0].gets + workers[1].gets
        assert any("input_items?limit=5" in g for g in seen)
        assert (await c.put(f"/v1/responses/{rid}")).status_code == 405


async def test_the_owner_leaving_the_fleet_is_404_and_the_owner_down_is_503() -> None:
    async with gateway(OpenAIWorker("w0"), OpenAIWorker("w1")) as (c, workers):
        first = await c.post("/v1/responses", json={"model": "m1", "input": "hi"})
        owner = first.headers["x-kvgate-worker"]
        body = {"model": "m1", "input": "more", "previous_response_id": first.json()["id"]}
        down = next(w for w in workers if w.url.endswith(owner))
        await down.stop()

        async def unhealthy() -> bool:
            listed = (await c.get("/admin/workers")).json()["workers"]
            return not next(w for w in listed if w["id"] == owner)["healthy"]

        await until(unhealthy)
        resp = await c.post("/v1/responses", json=body)
        assert resp.status_code == 503  # never sent elsewhere without its history
        assert (await c.delete(f"/admin/workers/{owner}")).status_code == 202

        async def removed() -> bool:
            return all(w["id"] != owner for w in (await c.get("/admin/workers")).json()["workers"])

        await until(removed)
        resp = await c.post("/v1/responses", json=body)
        assert resp.status_code == 404
        assert resp.json()["error"]["param"] == "previous_response_id"


async def test_embeddings_and_pass_through_routes_are_load_balanced_and_relayed() -> None:
    pair = (OpenAIWorker("w0"), OpenAIWorker("w1"))
    async with gateway(*pair, policy="prefix_cache_aware", tokenizer="bytes") as (c, workers):
        body = {"model": "m1", "input": ["same text"] * 4, "encoding_format": "float", "dimensions": 2}

        async def embed() -> str:
            resp = await c.post("/v1/embeddings", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["data"][0]["embedding"] == [0.6, 0.8]
            return str(resp.json()["worker"])

        served = await asyncio.gather(*(embed() for _ in range(8)))
        assert set(served) == {"w0", "w1"}  # by load, not by a (meaningless) prefix
        assert all(b == body for w in workers for b in w.seen("/v1/embeddings"))
        tok = await c.post("/tokenize", json={"prompt": "abc"})  # no model: a one-model fleet
        assert tok.status_code == 200 and tok.json()["count"] == 3
        stream = await c.post("/v1/messages", json={"model": "m1", "max_tokens": 5, "stream": True,
                                                        "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        assert stream.content.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        assert (await c.post("/v1/embeddings", json={"input": "x"})).status_code == 400  # model required
        assert (await c.post("/v1/embeddings", content=b"[1]")).status_code == 400
        assert (await c.post("/v1/not-a-route", json={"model": "m1"})).status_code == 404
        assert (await c.post("/v1/embeddings", json={"model": "nope", "input": "x"})).status_code == 404


async def test_a_pass_through_stream_cut_short_drops_the_connection() -> None:
    async with gateway(OpenAIWorker("w0", mode="die_mid_stream")) as (c, _workers):
        body = {
            "model": "m1",
            "max_tokens": 5,
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
        }
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post("/v1/messages", json=body)  # not a clean end: the client knows it was cut


async def test_fields_the_gateway_does_not_read_reach_the_worker_untouched() -> None:
    extra = {
        "n": 3, "logprobs": True, "top_logprobs": 2, "seed": 7, "stop": ["\n", "END"],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "auto", "response_format": {"type": "json_object"},
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "some_future_field": {"nested": [1, 2.5, None, "x"]},
    }  # fmt: skip
    worker = FakeWorker("w0")
    async with (
        running_chat(worker),
        serving(settings_for(worker.url)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **extra}

        async def answered() -> bool:
            return (await c.post("/v1/chat/completions", json=body)).status_code == 200

        await until(answered)
        assert worker.bodies[-1] == body
        parts = [{"type": "text", "text": "what is this?"},
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]  # fmt: skip
        vision = {"model": "fake-model", "messages": [{"role": "user", "content": parts}]}
        assert (await c.post("/v1/chat/completions", json=vision)).status_code == 200
        assert worker.bodies[-1] == vision

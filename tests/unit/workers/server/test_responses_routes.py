"""``/v1/responses`` on an in-process sim worker: create, stream, continue, retrieve, delete, cancel."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

QUESTION = "What does a prefix cache keep between requests? Answer in a sentence."


async def _create(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/responses", json={"input": QUESTION, "max_output_tokens": 6, **body})


async def _count(client: httpx.AsyncClient, messages: list[dict[str, str]]) -> int:
    return int((await client.post("/tokenize", json={"messages": messages})).json()["count"])


async def test_create_answers_a_response_with_the_chat_prompts_usage(sim_client: httpx.AsyncClient) -> None:
    resp = await _create(sim_client, instructions="Be brief.")
    assert resp.status_code == 200
    obj = resp.json()
    assert (obj["object"], obj["status"]) == ("response", "incomplete")
    assert obj["usage"]["output_tokens"] == 6
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    assert obj["usage"]["input_tokens"] == await _count(sim_client, messages)
    again = (await _create(sim_client, instructions="Be brief.")).json()
    assert again["output"][0]["content"][0]["text"] == obj["output"][0]["content"][0]["text"]
    cached = again["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached == (obj["usage"]["input_tokens"] - 1) // 16 * 16  # as chat counts it


async def test_stream_sends_events_and_no_done_line(sim_client: httpx.AsyncClient) -> None:
    resp = await _create(sim_client, stream=True)
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in resp.text.split("\n\n") if f]
    assert all(f.startswith("event: ") for f in frames)
    docs = [orjson.loads(f.split("\n", 1)[1].removeprefix("data: ")) for f in frames]
    assert [d["sequence_number"] for d in docs] == list(range(len(docs)))
    assert docs[-1]["type"] == "response.incomplete"
    text = "".join(d["delta"] for d in docs if d["type"] == "response.output_text.delta")
    assert docs[-1]["response"]["output"][0]["content"][0]["text"] == text
    stored = await sim_client.get(f"/v1/responses/{docs[-1]['response']['id']}")
    assert stored.json() == docs[-1]["response"]


async def test_previous_response_id_renders_the_stored_conversation(sim_client: httpx.AsyncClient) -> None:
    first = (await _create(sim_client, instructions="Old rules.")).json()
    second = (
        await _create(sim_client, input="And then?", previous_response_id=first["id"], instructions="New.")
    ).json()
    messages = [
        {"role": "system", "content": "New."},  # the new request's instructions replace the old ones
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first["output"][0]["content"][0]["text"]},
        {"role": "user", "content": "And then?"},
    ]
    assert second["usage"]["input_tokens"] == await _count(sim_client, messages)
    assert second["previous_response_id"] == first["id"]


async def test_unknown_previous_response_is_openais_404(sim_client: httpx.AsyncClient) -> None:
    resp = await _create(sim_client, previous_response_id="resp_nope")
    assert resp.status_code == 404
    assert resp.json() == {"error": {
        "message": "Previous response with id 'resp_nope' not found.", "type": "invalid_request_error",
        "param": "previous_response_id", "code": "previous_response_not_found",
    }}  # fmt: skip


async def test_retrieve_delete_and_cancel(sim_client: httpx.AsyncClient) -> None:
    rid = (await _create(sim_client)).json()["id"]
    assert (await sim_client.get(f"/v1/responses/{rid}")).json()["id"] == rid
    cancel = await sim_client.post(f"/v1/responses/{rid}/cancel")
    assert cancel.status_code == 400
    assert "background" in cancel.json()["error"]["message"]
    deleted = await sim_client.delete(f"/v1/responses/{rid}")
    assert deleted.json() == {"id": rid, "object": "response.deleted", "deleted": True}
    for method, path in [("GET", rid), ("DELETE", rid), ("POST", f"{rid}/cancel")]:
        resp = await sim_client.request(method, f"/v1/responses/{path}")
        assert resp.status_code == 404
        assert resp.json()["error"]["message"] == f"Response with id '{rid}' not found."


async def test_store_false_keeps_nothing_and_the_store_is_bounded(sim_client: httpx.AsyncClient) -> None:
    unstored = (await _create(sim_client, store=False)).json()
    assert unstored["store"] is False
    assert (await sim_client.get(f"/v1/responses/{unstored['id']}")).status_code == 404
    ids = [(await _create(sim_client)).json()["id"] for _ in range(5)]  # the fixture's store holds 4
    assert (await sim_client.get(f"/v1/responses/{ids[0]}")).status_code == 404
    assert (await sim_client.get(f"/v1/responses/{ids[-1]}")).status_code == 200


async def test_image_input_parts_are_rendered_by_the_sim(sim_client: httpx.AsyncClient) -> None:
    parts = [
        {"type": "input_text", "text": "Describe:"},
        {"type": "input_image", "image_url": "https://x/y.png"},
    ]
    resp = await _create(sim_client, input=[{"role": "user", "content": parts}])
    assert resp.status_code == 200
    assert resp.json()["usage"]["input_tokens"] > 30  # the image's identity marker is part of the prompt


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"background": True}, "background"),
        ({"input": 3}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"store": "yes"}, "store"),
        ({"temperature": 5}, "temperature"),
        ({"model": "other"}, "model"),
    ],
    ids=["background", "input-type", "bad-role", "limit", "store", "temperature", "model"],
)
async def test_bad_requests_get_openai_errors(
    sim_client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    resp = await _create(sim_client, **body)
    assert resp.status_code in (400, 404)
    error = resp.json()["error"]
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}

"""The worker HTTP surface over a fast SimEngine, in-process (httpx ASGITransport and raw ASGI calls)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from kvgate_core.kvcontract.events import EventType
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from workers.server.app import create_app
from workers.server.info_routes import _event_stream, _snapshot
from workers.sim.engine import SimConfig, SimEngine
from workers.sim.scheduler import SimTiming

PROMPT = "You are a helpful assistant. Please answer the following question in detail: " * 2


def _engine(**timing: float) -> SimEngine:
    t = SimTiming(prefill_tps=timing.get("prefill_tps", 1e7), decode_tps=timing.get("decode_tps", 1e5))
    return SimEngine(SimConfig(worker_id="w", timing=t, kv_tokens=4096), byte_bundle("kvgate-sim"))


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    eng = _engine()
    await eng.start()
    yield eng
    await eng.stop()


@pytest.fixture
async def client(engine: SimEngine) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
        yield c


def _chat(**extra: object) -> dict[str, object]:
    return {
        "model": "kvgate-sim",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 12,
        **extra,
    }


async def test_chat_is_deterministic_and_reports_cached_prefix(client: httpx.AsyncClient):
    first = (await client.post("/v1/chat/completions", json=_chat())).json()
    second = (await client.post("/v1/chat/completions", json=_chat())).json()
    assert first["object"] == "chat.completion"
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"] != ""
    usage = second["usage"]
    assert usage["completion_tokens"] == 12
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage["prompt_tokens_details"]["cached_tokens"] == (usage["prompt_tokens"] - 1) // 16 * 16


async def test_seed_changes_the_text(client: httpx.AsyncClient):
    a = (await client.post("/v1/chat/completions", json=_chat(seed=1))).json()
    b = (await client.post("/v1/chat/completions", json=_chat(seed=2))).json()
    assert a["choices"][0]["message"]["content"] != b["choices"][0]["message"]["content"]


async def test_completions_accept_text_and_token_ids(client: httpx.AsyncClient):
    text = (await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})).json()
    ids = (await client.post("/v1/completions", json={"prompt": [104, 101, 108, 108, 111]})).json()
    assert text["object"] == "text_completion"
    assert text["usage"]["completion_tokens"] == 3
    assert ids["usage"]["prompt_tokens"] == 5
    assert ids["usage"]["completion_tokens"] <= 16  # OpenAI's default max_tokens for completions


async def test_streaming_chat_with_usage(client: httpx.AsyncClient):
    body = _chat(stream=True, stream_options={"include_usage": True})
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = [f.removeprefix("data: ") for f in resp.text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    chunks = [orjson.loads(f) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    whole = (await client.post("/v1/chat/completions", json=_chat())).json()
    assert streamed == whole["choices"][0]["message"]["content"]


async def test_streaming_completions_without_usage(client: httpx.AsyncClient):
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "stream": True})
    frames = [f.removeprefix("data: ") for f in resp.text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    assert all("usage" not in orjson.loads(f) for f in frames[:-1])
    assert orjson.loads(frames[-2])["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", _chat(n=9), 400, "n"),
        ("/v1/chat/completions", _chat(model="other"), 404, "model"),
        ("/v1/chat/completions", _chat(max_tokens=0), 400, "max_tokens"),
        ("/v1/chat/completions", _chat(max_tokens=10**6), 400, "max_tokens"),
        ("/v1/chat/completions", _chat(temperature="hot"), 400, "temperature"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
        ("/v1/completions", {"prompt": [-1]}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ],
    ids=["n", "model", "max-tokens-0", "context", "temperature", "no-messages", "batch", "bad-id", "stream"],
)
async def test_bad_requests_get_openai_errors(client: httpx.AsyncClient, path, body, status, param):
    resp = await client.post(path, json=body)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}


async def test_context_too_long_has_its_code(client: httpx.AsyncClient):
    resp = await client.post("/v1/chat/completions", json=_chat(max_tokens=10**6))
    assert resp.json()["error"]["code"] == "context_length_exceeded"


async def test_malformed_json_and_unknown_route(client: httpx.AsyncClient):
    bad = await client.post("/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
    missing = await client.get("/v2/nothing")
    assert missing.status_code == 404
    assert "error" in missing.json()


async def test_info_routes(client: httpx.AsyncClient):
    await client.post("/v1/chat/completions", json=_chat())
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["kvgate-sim"]
    assert (await client.get("/health")).json() == {"status": "ok"}
    load = (await client.get("/load")).json()
    assert load["running"] == load["waiting"] == 0
    assert load["num_cached_blocks"] > 0
    blocks = (await client.get("/kv/blocks")).json()
    assert len(blocks["tiers"]["gpu"]) == load["num_cached_blocks"]
    assert blocks["block_size"] == 16


async def test_tokenize_and_tokenizer_bundle(client: httpx.AsyncClient):
    text = (await client.post("/tokenize", json={"prompt": "hi"})).json()
    assert text["tokens"] == [104, 105]
    chat = (await client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})).json()
    bundle = TokenizerBundle.from_json((await client.get("/tokenizer")).content)
    rendered = bundle.chat_template.render([{"role": "user", "content": "hi"}])
    assert chat["tokens"] == bundle.tokenizer.encode(rendered)
    bad = await client.post("/tokenize", json={"messages": "nope"})
    assert bad.status_code == 400


async def test_kv_event_stream_starts_with_a_snapshot(engine: SimEngine, client: httpx.AsyncClient):
    await client.post("/v1/chat/completions", json=_chat())
    subscription = engine.subscribe()
    frames = _event_stream(subscription, _snapshot(engine))
    cleared = orjson.loads((await anext(frames)).removeprefix(b"data: "))
    stored = orjson.loads((await anext(frames)).removeprefix(b"data: "))
    assert cleared["type"] == EventType.CLEARED
    assert sorted(stored["hashes"]) == sorted(engine.cached_block_hashes()["gpu"])
    await client.post(
        "/v1/chat/completions", json=_chat(messages=[{"role": "user", "content": PROMPT + "new"}])
    )
    live = orjson.loads((await anext(frames)).removeprefix(b"data: "))
    assert live["type"] == "stored"
    assert live["worker"] == "w"
    await frames.aclose()
    assert engine._hub.num_subscribers == 0


async def _call_then_disconnect(engine: SimEngine, body: dict[str, object]) -> list[dict[str, object]]:
    """Run the app on one request whose client leaves once the engine runs it."""
    app = create_app(engine)
    sent: list[dict[str, object]] = []
    request_sent = False

    async def receive() -> dict[str, object]:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": orjson.dumps(body), "more_body": False}
        for _ in range(1000):  # poll with a deadline (about 5 s)
            if engine.load().running:
                break
            await asyncio.sleep(0.005)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
             "query_string": b"", "app": app}  # fmt: skip
    await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_client_disconnect_aborts_the_sequence(stream: bool):
    engine = _engine(decode_tps=5.0)  # slow: the client always leaves mid-generation
    await engine.start()
    try:
        sent = await _call_then_disconnect(engine, _chat(stream=stream, max_tokens=1000, ignore_eos=True))
        assert not any(m.get("more_body") is False for m in sent)  # the response never completed
        load = engine.load()
        assert (load.running, load.waiting) == (0, 0)
        assert load.kv_usage == 0.0
    finally:
        await engine.stop()

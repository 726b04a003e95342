"""The TGI v3 fake's surface: /info, metrics, the two tokenize routes, usage, stream shape and errors."""

from __future__ import annotations

import pytest

from tests.support.engines.core import BOS_ID
from tests.unit.engines_fakes.harness import HELLO, chat, events, fake, frames

pytestmark = pytest.mark.timeout(30)

INFO_KEYS = [
    "model_id", "model_sha", "model_pipeline_tag", "max_concurrent_requests", "max_best_of",
    "max_stop_sequences", "max_input_tokens", "max_total_tokens", "validation_workers",
    "max_client_batch_size", "router", "version", "sha", "docker_label",
]  # fmt: skip


async def test_models_info_health_and_metrics() -> None:
    async with fake("tgi") as c:
        models = (await c.get("/v1/models")).json()["data"]
        assert models == [{"id": "fake-org/tgi-fake", "object": "model", "created": 0,
                           "owned_by": "fake-org/tgi-fake"}]  # fmt: skip
        info = (await c.get("/info")).json()
        assert (
            list(info) == INFO_KEYS
            and info["router"] == "text-generation-router"
            and info["version"] == "3.3.7"
        )
        assert (await c.get("/health")).content == b""
        text = (await c.get("/metrics")).text
        for name in ("tgi_queue_size", "tgi_batch_current_size", "tgi_batch_current_max_tokens",
                     "tgi_batch_max_total_tokens"):  # fmt: skip
            assert f"\n{name} " in text
        assert "tgi_batch_max_total_tokens 65536.0" in text


async def test_chat_tokenize_is_exact_and_tokenize_adds_bos() -> None:
    async with fake("tgi") as c:
        doc = (await c.post("/chat_tokenize", json={"model": "tgi", "messages": HELLO})).json()
        assert set(doc) == {"tokenize_response", "templated_text"}
        ids = [t["id"] for t in doc["tokenize_response"]]
        assert set(doc["tokenize_response"][0]) == {"id", "text", "start", "stop"}
        usage = (await c.post("/v1/chat/completions", json=chat())).json()["usage"]
        assert usage == {"prompt_tokens": len(ids), "completion_tokens": 4, "total_tokens": len(ids) + 4}
        plain = (await c.post("/tokenize", json={"inputs": doc["templated_text"]})).json()
        assert [t["id"] for t in plain] == [BOS_ID, *ids]  # the templated text gets a BOS on top


async def test_stream_shape_usage_chunk_and_any_model_name() -> None:
    async with fake("tgi") as c:
        got = events(
            (await c.post("/v1/chat/completions", json=chat("my-adapter", stream=True, usage=True))).content
        )
        chunks, usage, done = got[:-2], got[-2], got[-1]
        assert done == "[DONE]" and all(ch["id"] == "" for ch in got[:-1])
        assert all(ch["choices"][0]["delta"]["role"] == "assistant" for ch in chunks)  # no role-only chunk
        assert chunks[0]["choices"][0]["delta"]["content"] != ""
        assert all(ch["model"] == "my-adapter" for ch in got[:-1])  # streams echo the request's model
        assert usage["choices"] == [] and set(usage["usage"]) == {
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
        }
        reply = await c.post("/v1/chat/completions", json=chat())
        assert reply.headers["x-prompt-tokens"] == str(reply.json()["usage"]["prompt_tokens"])
        assert reply.json()["model"] == "fake-org/tgi-fake"  # a whole reply names the served model
        tgi = events((await c.post("/v1/chat/completions", json=chat("tgi", stream=True))).content)
        assert tgi[0]["model"] == "fake-org/tgi-fake"


async def test_keep_alive_comments_while_waiting() -> None:
    async with fake("tgi", "--keep-alive-s", "0.02", "--prefill-ms-per-token", "2") as c:
        raw = (await c.post("/v1/chat/completions", json=chat(stream=True))).content
        assert b":" in frames(raw)  # at least one ":\n\n" before the first token
        assert events(raw)[-1] == "[DONE]"


async def test_mid_stream_error_shape() -> None:
    async with fake("tgi") as c:
        await c.post("/_fake/fault", json={"fail_after_tokens": 1, "count": 2})
        got = events((await c.post("/v1/chat/completions", json=chat(stream=True))).content)
        assert got[-1] == "[DONE]" and got[-2] == {"error": {"message": "injected engine failure",
                                                             "http_status_code": 424}}  # fmt: skip
        reply = await c.post("/v1/chat/completions", json=chat())
        assert reply.status_code == 424 and reply.json()["error_type"] == "generation"

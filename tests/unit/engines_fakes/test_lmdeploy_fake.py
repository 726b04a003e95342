"""The LMDeploy fake's surface: health JSON, metrics, /v1/encode, prefix caching off by default, usage."""

from __future__ import annotations

import pytest

from tests.support.engines.core import BOS_ID
from tests.unit.engines_fakes.harness import chat, events, fake

pytestmark = pytest.mark.timeout(30)


async def test_models_health_and_metrics() -> None:
    async with fake("lmdeploy") as c:
        card = (await c.get("/v1/models")).json()["data"][0]
        assert card["owned_by"] == "lmdeploy" and card["root"] == "lmdeploy-fake" and card["permission"]
        assert (await c.get("/health")).json()["status"] == "healthy"
        text = (await c.get("/metrics")).text
        labels = '{model_name="lmdeploy-fake",engine="0"}'
        for name in ("num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc"):
            assert f"lmdeploy:{name}{labels} " in text
    async with fake("lmdeploy", "--disable-metrics") as c:
        assert (await c.get("/metrics")).status_code == 404


async def test_encode() -> None:
    async with fake("lmdeploy") as c:
        assert (await c.post("/v1/encode", json={"input": "hi"})).json() == {"input_ids": [BOS_ID, 104, 105],
                                                                              "length": 3}  # fmt: skip
        doc = (await c.post("/v1/encode", json={"input": ["a", "bc"], "add_bos": False})).json()
        assert doc == {"input_ids": [[97], [98, 99]], "length": [1, 2]}
        wrapped = (
            await c.post("/v1/encode", json={"input": "hi", "do_preprocess": True, "add_bos": False})
        ).json()
        assert wrapped["input_ids"][0] == 257  # one user turn in the template


async def test_prefix_caching_off_by_default_and_cached_tokens_always_present() -> None:
    async with fake("lmdeploy") as c:
        for _ in range(2):
            reply = (await c.post("/v1/chat/completions", json=chat())).json()
        assert reply["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert reply["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
        assert reply["id"] == "2"  # ids are session ids
    async with fake("lmdeploy", "--enable-prefix-caching") as c:
        for _ in range(2):
            usage = (await c.post("/v1/chat/completions", json=chat())).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] // 64 * 64 > 0


async def test_stream_usage_only_when_asked_and_error_event() -> None:
    async with fake("lmdeploy") as c:
        plain = events((await c.post("/v1/chat/completions", json=chat(stream=True))).content)
        assert all(e == "[DONE]" or e["choices"] for e in plain)
        asked = events((await c.post("/v1/chat/completions", json=chat(stream=True, usage=True))).content)
        assert asked[-2]["choices"] == [] and "prompt_tokens_details" in asked[-2]["usage"]
        await c.post("/_fake/fault", json={"fail_after_tokens": 1, "count": 1})
        failed = events((await c.post("/v1/chat/completions", json=chat(stream=True))).content)
        assert failed[-1] == "[DONE]" and set(failed[-2]["error"]) == {"message", "type", "code", "param"}


async def test_input_ids_only_without_messages() -> None:
    async with fake("lmdeploy") as c:
        both = await c.post("/v1/chat/completions", json=chat(input_ids=[1, 2, 3]))
        assert both.status_code == 400 and "messages takes priority" in both.json()["message"]
        body = {"model": "m", "messages": [], "input_ids": [1, 2, 3], "max_tokens": 2}
        assert (await c.post("/v1/chat/completions", json=body)).json()["usage"]["prompt_tokens"] == 3

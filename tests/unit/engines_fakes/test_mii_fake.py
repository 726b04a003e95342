"""The DeepSpeed-MII fake's surface: static health, strict model name, streams without usage/object/created."""

from __future__ import annotations

import pytest

from tests.support.engines.core import EngineFailureError
from tests.unit.engines_fakes.harness import HELLO, chat, events, fake

pytestmark = pytest.mark.timeout(30)

MODEL = "fake-org/mii-fake"


async def test_models_health_and_no_metrics() -> None:
    async with fake("mii") as c:
        card = (await c.get("/v1/models")).json()["data"][0]
        assert card["id"] == MODEL and card["owned_by"] == "deepspeed-mii"
        assert (await c.get("/health")).json() == {"status": "ok"}
        assert (await c.get("/metrics")).status_code == 404


async def test_model_must_match_exactly() -> None:
    async with fake("mii") as c:
        reply = await c.post("/v1/chat/completions", json=chat("mii-fake"))
        assert reply.status_code == 400
        assert reply.json() == {"object": "error", "code": 40301,
                                "message": f'Model "mii-fake" not found. Please use "{MODEL}".'}  # fmt: skip
        parts = chat(MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
        assert (await c.post("/v1/chat/completions", json=parts)).json()["code"] == 40001
        assert (await c.post("/v1/chat/completions", json=chat(MODEL))).status_code == 200


async def test_stream_has_no_usage_no_object_no_created() -> None:
    async with fake("mii") as c:
        got = events(
            (await c.post("/v1/chat/completions", json=chat(MODEL, stream=True, usage=True))).content
        )
        assert got[-1] == "[DONE]"
        assert all(set(ch) == {"id", "model", "choices"} for ch in got[:-1])
        assert got[0]["choices"][0]["delta"] == {"role": "assistant"}
        assert all(ch["choices"] for ch in got[:-1])  # no usage chunk although include_usage was asked


async def test_non_stream_usage_counts_raw_contents() -> None:
    async with fake("mii") as c:
        usage = (await c.post("/v1/chat/completions", json=chat(MODEL, max_tokens=2))).json()["usage"]
        raw = sum(len(m["content"].encode()) for m in HELLO)
        assert usage == {"prompt_tokens": raw, "total_tokens": raw + 2, "completion_tokens": 2}


async def test_broken_keeps_health_but_fails_generations() -> None:
    async with fake("mii", "--broken") as c:
        assert (await c.get("/health")).status_code == 200
        reply = await c.post("/v1/chat/completions", json=chat(MODEL))
        assert reply.status_code == 500 and reply.text == "Internal Server Error"
        with pytest.raises(EngineFailureError):  # the stream breaks (over TCP: the connection drops)
            await c.post("/v1/chat/completions", json=chat(MODEL, stream=True))

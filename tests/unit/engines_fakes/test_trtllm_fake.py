"""The TensorRT-LLM fake's surface: model id, draining JSON /metrics and /kv_cache_events, stream quirks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.support.engines.core import EngineFailureError
from tests.unit.engines_fakes.harness import chat, events, fake, frames

pytestmark = pytest.mark.timeout(30)


async def test_model_id_is_the_model_directorys_basename(tmp_path: Path) -> None:
    model_dir = tmp_path / "Qwen3-8B"
    model_dir.mkdir()
    async with fake("trtllm", "--model", str(model_dir)) as c:
        card = (await c.get("/v1/models")).json()["data"][0]
        assert card["id"] == "Qwen3-8B" and card["owned_by"] == "tensorrt_llm"
        assert (await c.get("/version")).json() == {"version": "1.2.1"}
        assert (await c.get("/health")).content == b""
        assert (await c.get("/health_generate")).text == "Generation health check OK"
        reply = (await c.post("/v1/chat/completions", json=chat("anything"))).json()
        assert reply["model"] == "Qwen3-8B"  # the request's model is not checked


async def test_json_metrics_drain_and_end_after_a_quiet_wait() -> None:
    flags = ("--enable-iter-perf-stats", "--metrics-wait-s", "1.0", "--decode-ms-per-token", "5")
    async with fake("trtllm", *flags) as c:
        assert (await c.get("/metrics")).json() == []  # nothing ran: the wait ends it
        await c.post("/v1/chat/completions", json=chat(max_tokens=8))
        stats = (await c.get("/metrics")).json()
        assert stats and stats[0]["numActiveRequests"] == 1
        assert {"iter", "iterLatencyMS", "numQueuedRequests", "maxNumActiveRequests", "kvCacheStats",
                "inflightBatchingStats"} <= set(stats[0])  # fmt: skip
        assert stats[0]["kvCacheStats"]["tokensPerBlock"] == 32
        assert "numPausedRequests" in stats[0]["inflightBatchingStats"]
        assert stats[-1]["numActiveRequests"] == 0  # it read on through the idle iteration
        start = time.perf_counter()
        assert (await c.get("/metrics")).json() == []  # ended, and no request since: at once
        assert time.perf_counter() - start < 0.5  # not the 1 s wait
        assert (await c.get("/prometheus/metrics")).status_code == 404


async def test_json_metrics_answer_only_after_the_engines_2_s_wait() -> None:
    async with fake("trtllm", "--enable-iter-perf-stats", "--decode-ms-per-token", "5") as c:
        await c.post("/v1/chat/completions", json=chat(max_tokens=8))
        start = time.perf_counter()
        assert (await c.get("/metrics")).json()
        assert time.perf_counter() - start >= 1.9


async def test_json_metrics_wait_out_a_running_generation() -> None:
    """Under load entries keep coming, so the read answers only once the load pauses."""
    flags = ("--enable-iter-perf-stats", "--metrics-wait-s", "0.5", "--decode-ms-per-token", "5")
    async with fake("trtllm", *flags) as c:
        long = asyncio.create_task(c.post("/v1/chat/completions", json=chat(max_tokens=120, ignore_eos=True)))
        await asyncio.sleep(0.1)
        stats = (await c.get("/metrics")).json()
        assert long.done()  # it answered only after the generation ended
        assert len(stats) > 20 and stats[-1]["numActiveRequests"] == 0


async def test_json_metrics_are_empty_without_iter_perf_stats() -> None:
    async with fake("trtllm", "--metrics-wait-s", "0.05", "--decode-ms-per-token", "5") as c:
        await c.post("/v1/chat/completions", json=chat(max_tokens=8))
        assert (await c.get("/metrics")).json() == []


async def test_streams_echo_the_requests_model() -> None:
    async with fake("trtllm") as c:
        got = events((await c.post("/v1/chat/completions", json=chat("asked-for", stream=True))).content)
        assert all(ch["model"] == "asked-for" for ch in got[:-1])
        assert (await c.post("/v1/chat/completions", json=chat("asked-for"))).json()["model"] == "trtllm-fake"


async def test_prometheus_only_with_return_perf_metrics_and_its_collector_steals_samples() -> None:
    async with fake("trtllm", "--return-perf-metrics", "--decode-ms-per-token", "20") as c:
        text = (await c.get("/prometheus/metrics")).text
        for name in (
            "trtllm_num_requests_running",
            "trtllm_num_requests_waiting",
            "trtllm_kv_cache_utilization",
        ):
            assert name in text
        await c.post("/v1/chat/completions", json=chat(max_tokens=20))  # 0.4 s of iterations
        left = (await c.get("/metrics")).json()
        assert not left or left[0]["iter"] > 0  # the first iterations went to the server's own collector


async def test_kv_cache_events_drain_schema() -> None:
    async with fake("trtllm") as c:
        await c.post("/v1/chat/completions", json=chat())
        assert (await c.post("/kv_cache_events")).json() == []  # event_buffer_max_size 0: off
    async with fake("trtllm", "--event-buffer-max-size", "100", "--extra-window-size", "512") as c:
        await c.post("/v1/chat/completions", json=chat())
        got = (await c.post("/kv_cache_events")).json()
        assert (await c.post("/kv_cache_events")).json() == []
        assert [e["event_id"] for e in got] == list(range(len(got)))
        assert got[0]["data"]["type"] == "created" and got[0]["window_size"] == 32_768
        stored = [e for e in got if e["data"]["type"] == "stored"]
        assert {e["window_size"] for e in stored} == {32_768, 512}
        blocks = stored[0]["data"]["blocks"]
        assert stored[0]["data"]["parent_hash"] is None
        assert blocks[0]["type"] == "stored_block" and set(blocks[0]) == {"type", "block_hash", "tokens",
                                                                          "cache_level", "priority"}  # fmt: skip
        assert blocks[0]["tokens"][0] == {"type": "unique_token", "token_id": 257, "token_extra_id": 0}
        assert [len(b["tokens"]) for b in blocks[:-1]] == [32] * (len(blocks) - 1)
        assert 0 < len(blocks[-1]["tokens"]) < 32  # a partial trailing block (partial reuse)


async def test_cached_tokens_always_and_stream_quirks() -> None:
    async with fake("trtllm") as c:
        first = (await c.post("/v1/chat/completions", json=chat())).json()["usage"]
        assert first["prompt_tokens_details"] == {"cached_tokens": 0}
        raw = (await c.post("/v1/chat/completions", json=chat(stream=True, usage=True))).content
        parts = frames(raw)
        assert parts[0].endswith(b"} ") and not parts[1].endswith(b" ")  # "data: {json} \n\n" first
        got = events(raw)
        assert "finish_reason" not in got[0]["choices"][0] and "logprobs" not in got[1]["choices"][0]
        assert got[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and got[-1] == "[DONE]"
        completion = events((await c.post("/v1/completions", json={"model": "m", "prompt": "hi", "stream": True,
                                                                   "max_tokens": 2})).content)  # fmt: skip
        assert completion[0]["object"] == "text_completion" and completion[-1] == "[DONE]"


async def test_mid_stream_failure_drops_the_connection_and_plain_failure_is_400() -> None:
    async with fake("trtllm") as c:
        await c.post("/_fake/fault", json={"fail_after_tokens": 1, "count": 2})
        with pytest.raises(EngineFailureError):  # in process the app's exception surfaces; over TCP it drops
            await c.post("/v1/chat/completions", json=chat(stream=True))
        reply = await c.post("/v1/chat/completions", json=chat())
        assert reply.status_code == 400 and reply.json()["type"] == "BadRequestError"


async def test_prompt_token_ids_on_chat() -> None:
    async with fake("trtllm") as c:
        reply = await c.post("/v1/chat/completions", json=chat(prompt_token_ids=list(range(70))))
        assert reply.json()["usage"]["prompt_tokens"] == 70

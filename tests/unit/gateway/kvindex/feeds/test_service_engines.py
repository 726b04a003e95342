"""The KV service following a TensorRT-LLM worker's HTTP drain (mocked transport) and reporting its feed."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.kvindex.service import open_kv_service
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from tests.support.waiting import eventually

PROMPT = list(range(500, 564))


def drained(event_id: int) -> list[dict[str, Any]]:
    blocks = [
        {
            "type": "stored_block", "block_hash": 100 + i, "cache_level": 0, "priority": 35,
            "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in PROMPT[i * 32 : (i + 1) * 32]],
        }
        for i in range(2)
    ]  # fmt: skip
    return [
        {
            "event_id": event_id,
            "window_size": 512,
            "data": {"type": "stored", "parent_hash": None, "blocks": blocks},
        }
    ]


async def test_a_trtllm_worker_is_polled_and_its_32_token_blocks_indexed() -> None:
    answers: list[httpx.Response] = [httpx.Response(500), httpx.Response(200, json=drained(0))]
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url}")
        return answers.pop(0) if answers else httpx.Response(200, json=[])

    ours = chain_hashes(PROMPT, root_hash("llama"), 16)
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client,
        open_kv_service(state_url="memory", block_size=16, client=client) as kv,
    ):
        kv.add_trtllm_worker("trt-0", "http://trt:8000", "llama", block_size=32)
        await eventually(
            lambda: kv.index.longest_prefix(ours, ["trt-0"])["trt-0"].gpu_blocks == 4, timeout_s=5
        )
        status = kv.feed_status("trt-0")
        assert status is not None
        assert (status["engine"], status["state"], kv.feed_trusted("trt-0")) == ("trtllm", "flowing", True)
        assert status["sources"][0]["num_batches"] == 1
        kv.remove_worker("trt-0")
        assert kv.index.longest_prefix(ours, ["trt-0"])["trt-0"].gpu_blocks == 0
    assert seen[:2] == ["POST http://trt:8000/kv_cache_events"] * 2

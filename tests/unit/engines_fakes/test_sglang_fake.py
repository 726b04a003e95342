"""The SGLang 0.5.23 fake's surface: loads, metrics behind a flag, tokenize, cache report, streams, events."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq

from tests.support.engines.core import BOS_ID
from tests.support.procs import free_port, free_port_run
from tests.unit.engines_fakes.harness import HELLO, chat, events, fake

pytestmark = pytest.mark.timeout(30)

CORE_KEYS = [
    "dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens", "num_used_tokens",
    "num_total_tokens", "num_active_tokens", "max_total_num_tokens", "max_running_requests", "token_usage",
    "gen_throughput", "cache_hit_rate", "utilization",
]  # fmt: skip


async def test_models_health_server_info_and_loads_shape() -> None:
    async with fake("sglang", "--page-size", "16") as c:
        card = (await c.get("/v1/models")).json()["data"][0]
        assert card["owned_by"] == "sglang" and card["id"] == "sglang-fake"
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/health_generate")).status_code == 200
        info = (await c.get("/server_info")).json()
        assert (
            info["page_size"] == 16 and info["max_total_num_tokens"] == 65_536 and info["version"] == "0.5.23"
        )
        assert info["kv_events_config"] is None
        doc = (await c.get("/v1/loads")).json()
        assert list(doc) == ["timestamp", "version", "accelerator", "num_accelerators", "loads"]
        load = doc["loads"][0]
        assert list(load)[: len(CORE_KEYS)] == CORE_KEYS
        assert set(load["queues"]) == {"waiting", "grammar", "paused", "retracted", "prealloc_ready"}
        assert list((await c.get("/v1/loads?include=core")).json()["loads"][0]) == CORE_KEYS
        prom = (await c.get("/v1/loads?format=prometheus")).text
        assert 'sglang_num_running_reqs{dp_rank="0"} 0.0' in prom
        assert (await c.get("/get_load")).status_code == 404


async def test_metrics_only_with_enable_metrics() -> None:
    async with fake("sglang") as c:
        assert (await c.get("/metrics")).status_code == 404
    async with fake("sglang", "--enable-metrics") as c:
        text = (await c.get("/metrics")).text
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"):
            assert f'{name}{{model_name="sglang-fake"' in text


async def test_tokenize_with_messages_matches_the_chat_prompt() -> None:
    async with fake("sglang", "--enable-cache-report", "--page-size", "16") as c:
        for path in ("/v1/tokenize", "/tokenize"):
            doc = (await c.post(path, json={"messages": HELLO})).json()
            assert set(doc) == {"tokens", "count", "max_model_len"} and doc["count"] == len(doc["tokens"])
        ids = doc["tokens"]
        assert ids[0] == 257 and BOS_ID not in ids  # ChatML rendered, no BOS added to a chat prompt
        usage = (await c.post("/v1/chat/completions", json=chat())).json()["usage"]
        assert usage["prompt_tokens"] == len(ids)
        # token-in on the chat route gives the same prompt (and now a cache hit)
        usage = (await c.post("/v1/chat/completions", json=chat(input_ids=ids))).json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": len(ids) // 16 * 16}


async def test_cached_tokens_only_with_cache_report_and_stream_usage_only_when_asked() -> None:
    async with fake("sglang") as c:
        for _ in range(2):
            usage = (await c.post("/v1/chat/completions", json=chat())).json()["usage"]
        assert usage["prompt_tokens_details"] is None and usage["reasoning_tokens"] == 0
        plain = events((await c.post("/v1/chat/completions", json=chat(stream=True))).content)
        assert plain[-1] == "[DONE]" and all(e == "[DONE]" or e["usage"] is None for e in plain)
        assert plain[0]["choices"][0]["delta"]["role"] == "assistant"
        asked = events((await c.post("/v1/chat/completions", json=chat(stream=True, usage=True))).content)
        assert asked[-2]["choices"] == [] and asked[-2]["usage"]["completion_tokens"] == 4


async def test_mid_stream_error_event_then_done() -> None:
    async with fake("sglang") as c:
        await c.post("/_fake/fault", json={"fail_after_tokens": 2, "count": 1})
        got = events((await c.post("/v1/chat/completions", json=chat(stream=True))).content)
        assert got[-1] == "[DONE]"
        assert set(got[-2]["error"]) == {"object", "message", "type", "param", "code"}


async def _recv(sock: zmq.Socket[bytes]) -> list[bytes]:
    """The next multipart message, polling without blocking the event loop the fake runs on."""
    for _ in range(500):
        if sock.poll(0):
            return sock.recv_multipart()
        await asyncio.sleep(0.01)
    raise TimeoutError("no ZMQ message within 5 s")


async def test_kv_events_over_zmq_with_replay() -> None:
    pub_port, replay_port = free_port(), free_port()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        async with fake("sglang", "--page-size", "16", "--events-port", str(pub_port),
                        "--events-replay-port", str(replay_port)) as c:  # fmt: skip
            info = (await c.get("/server_info")).json()
            assert f"tcp://*:{pub_port}" in info["kv_events_config"]
            sub.connect(f"tcp://127.0.0.1:{pub_port}")
            await asyncio.sleep(0.3)  # the slow-joiner: let the subscription reach the publisher
            await c.post("/v1/chat/completions", json=chat(cache_salt="tenant-a"))
            topic, seq, payload = await _recv(sub)
            assert topic == b"" and int.from_bytes(seq, "big") == 0
            ts, batch, dp_rank = msgpack.unpackb(payload)
            assert isinstance(ts, float) and dp_rank == 0
            assert all(e["type"] == "BlockStored" and len(e["block_hashes"]) == 1 for e in batch)
            first = batch[0]
            assert (
                first["parent_block_hash"] is None
                and first["block_size"] == 16
                and first["cache_salt"] == "tenant-a"
            )
            assert batch[1]["parent_block_hash"] == first["block_hashes"][0] and len(first["token_ids"]) == 16
            await c.post("/flush_cache")
            assert msgpack.unpackb((await _recv(sub))[2])[1] == [{"type": "AllBlocksCleared"}]
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(f"tcp://127.0.0.1:{replay_port}")
            dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            replies = [await _recv(dealer) for _ in range(3)]
            dealer.close(linger=0)
            assert [r[2] for r in replies[:2]] == [(0).to_bytes(8, "big"), (1).to_bytes(8, "big")]
            assert replies[2][2] == (-1).to_bytes(8, "big", signed=True)
    finally:
        sub.close(linger=0)
        ctx.term()


async def test_dp_ranks_each_publish_their_own_cache() -> None:
    """``--dp-size 2``: requests alternate between the ranks, each rank stores into its own cache and
    publishes on its own socket (base port + rank) with its rank in every batch, as ``/server_info`` says."""
    base = free_port_run(2)
    ctx = zmq.Context()
    subs = [ctx.socket(zmq.SUB) for _ in range(2)]
    try:
        flags = ("--page-size", "16", "--events-port", str(base), "--dp-size", "2", "--enable-cache-report")
        async with fake("sglang", *flags) as c:
            info = (await c.get("/server_info")).json()
            assert info["dp_size"] == 2
            assert info["kv_events"] == {
                "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": base, "topic": "",
                "block_size": 16, "dp_size": 2,
            }  # fmt: skip
            for rank, sub in enumerate(subs):
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                sub.connect(f"tcp://127.0.0.1:{base + rank}")
            await asyncio.sleep(0.3)  # the slow-joiner
            cached = []
            for _ in range(2):  # round robin: the second goes to the other rank, cold again
                usage = (await c.post("/v1/chat/completions", json=chat())).json()["usage"]
                cached.append(usage["prompt_tokens_details"]["cached_tokens"])
            assert cached == [0, 0]
            for rank, sub in enumerate(subs):
                _, _, payload = await _recv(sub)
                assert msgpack.unpackb(payload)[2] == rank
            loads = (await c.get("/v1/loads")).json()["loads"]
            assert [load["dp_rank"] for load in loads] == [0, 1]
            assert (await c.get("/v1/loads?dp_rank=1")).json()["loads"][0]["dp_rank"] == 1
            reply = (await c.post("/v1/chat/completions", json=chat(data_parallel_rank=1))).json()
            assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16  # rank 1 holds it now
    finally:
        for sub in subs:
            sub.close(linger=0)
        ctx.term()

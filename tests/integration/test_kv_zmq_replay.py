"""Replay of vLLM-format KV event batches through a real ZMQ PUB socket on loopback into the index."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from gateway.kvindex.adapters.vllm import EngineEventTranslator, TranslatorConfig, decode_batch
from gateway.kvindex.adapters.zmq_feed import ZmqFeedStats, run_zmq_feed
from gateway.kvindex.memory import MemoryKVIndex
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from tests.support.procs import free_port
from tests.support.waiting import eventually
from tests.unit.gateway.kvindex.vllm_batches import (
    BLOCK,
    MODEL,
    array_batch,
    map_batch,
    removed_map,
    stored_array,
    stored_map,
    tokens,
)

pytestmark = pytest.mark.integration


async def test_replayed_vllm_batches_in_both_encodings_reach_the_index() -> None:
    port = free_port()
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    index = MemoryKVIndex()
    stats = ZmqFeedStats()
    translator = EngineEventTranslator(TranslatorConfig(worker="vllm-0", model=MODEL, block_size=BLOCK))

    def sink(events):
        for event in events:
            index.apply(event)

    feed = asyncio.create_task(
        run_zmq_feed(endpoint=f"tcp://127.0.0.1:{port}", decode=decode_batch, translator=translator,
                     sink=sink, stats=stats)
    )  # fmt: skip
    full = tokens(4)
    ours = chain_hashes(full, root_hash(MODEL), BLOCK)
    batches = [
        array_batch(stored_array([b"a", b"b"], None, full[: 2 * BLOCK])),
        map_batch(stored_map([b"c", b"d"], b"b", full[2 * BLOCK :])),
        map_batch(removed_map([b"d"])),
    ]
    seq = 0

    async def send(payload: bytes) -> None:
        nonlocal seq
        await pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        seq += 1

    try:
        # A SUB socket misses what is published before it has connected: probe until the first batch lands.
        deadline = asyncio.get_running_loop().time() + 10
        while stats.num_batches == 0:
            assert asyncio.get_running_loop().time() < deadline, "the SUB socket never connected"
            await send(batches[0])
            await asyncio.sleep(0.02)
        for payload in batches[1:]:
            await send(payload)
        await eventually(lambda: stats.num_batches >= len(batches) and index.num_blocks() == 3)
        hit = index.longest_prefix(ours, ["vllm-0"])["vllm-0"]
        assert hit.gpu_blocks == 3
        assert stats.num_bad_batches == 0
    finally:
        feed.cancel()
        await asyncio.gather(feed, return_exceptions=True)
        pub.close(linger=0)
        ctx.term()


async def test_service_follows_an_engine_over_zmq() -> None:
    import httpx

    from gateway.kvindex.service import open_kv_service

    port = free_port()
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    ours = chain_hashes(tokens(2), root_hash(MODEL), BLOCK)
    try:
        async with (
            httpx.AsyncClient() as client,
            open_kv_service(state_url="memory", block_size=BLOCK, client=client) as service,
        ):
            service.add_engine_worker("engine-0", f"tcp://127.0.0.1:{port}", model=MODEL, engine="vllm")
            with pytest.raises(ValueError, match="not supported"):
                service.add_engine_worker("engine-1", "tcp://127.0.0.1:1", model=MODEL, engine="trt")
            deadline = asyncio.get_running_loop().time() + 10
            while service.index.longest_prefix(ours, ["engine-0"])["engine-0"].gpu_blocks != 2:
                assert asyncio.get_running_loop().time() < deadline, "events never reached the index"
                await pub.send_multipart(
                    [b"", (0).to_bytes(8, "big"), array_batch(stored_array([1, 2], None, tokens(2)))]
                )
                await asyncio.sleep(0.02)
    finally:
        pub.close(linger=0)
        ctx.term()

"""Foreign engines' KV event batches through real ZMQ sockets on loopback into the index: live, replayed, resynced.

``Publisher`` plays an engine's side as vLLM, SGLang and TensorRT-LLM describe it: an XPUB socket (so the
test knows when the feed has subscribed) sending ``[topic, seq, payload]``, and a ROUTER replay socket
answering ``[b"", start_seq]`` with ``[b"", topic, seq, payload]`` per buffered batch and an end marker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest
import zmq
import zmq.asyncio

from gateway.kvindex.feeds.feed_status import FeedStatus
from gateway.kvindex.feeds.rechunk import EngineEventTranslator, TranslatorConfig
from gateway.kvindex.feeds.zmq_feed import ZmqSource, ZmqTiming, run_zmq_feed
from gateway.kvindex.memory import MemoryKVIndex
from gateway.kvindex.service import open_kv_service
from kvgate_core.kvcontract.events import KVEvent
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

END = (-1).to_bytes(8, "big", signed=True)


class Publisher:
    """An engine's PUB (as XPUB) and ROUTER replay sockets on 127.0.0.1 with a replay buffer."""

    def __init__(self, ctx: zmq.asyncio.Context, topic: bytes = b"kv") -> None:
        self.topic = topic
        self.pub_url = f"tcp://127.0.0.1:{free_port()}"
        self.replay_url = f"tcp://127.0.0.1:{free_port()}"
        self.buffer: dict[int, bytes] = {}
        self.replay_requests: list[int] = []
        self.seq = 0
        self._pub = ctx.socket(zmq.XPUB)
        self._pub.bind(self.pub_url)
        self._router = ctx.socket(zmq.ROUTER)
        self._router.bind(self.replay_url)

    async def wait_subscribed(self) -> None:
        message = await asyncio.wait_for(self._pub.recv(), 10)
        assert message[:1] == b"\x01"

    async def publish(self, payload: bytes, *, drop: bool = False) -> int:
        """Buffer the batch under the next sequence number and send it (unless dropped on the way)."""
        seq, self.seq = self.seq, self.seq + 1
        self.buffer[seq] = payload
        if not drop:
            await self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def serve_replays(self) -> None:
        while True:
            identity, _, start = await self._router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            for seq in sorted(s for s in self.buffer if s >= first):
                await self._router.send_multipart(
                    [identity, b"", self.topic, seq.to_bytes(8, "big"), self.buffer[seq]]
                )
            await self._router.send_multipart([identity, b"", b"", END, b""])

    def close(self) -> None:
        self._pub.close(linger=0)
        self._router.close(linger=0)


@contextlib.asynccontextmanager
async def publisher() -> AsyncIterator[Publisher]:
    ctx = zmq.asyncio.Context()
    pub = Publisher(ctx)
    server = asyncio.create_task(pub.serve_replays())
    try:
        yield pub
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        pub.close()
        ctx.term()


@contextlib.asynccontextmanager
async def feed_into(index: MemoryKVIndex, pub: Publisher) -> AsyncIterator[FeedStatus]:
    status = FeedStatus(pub.pub_url, clock=asyncio.get_running_loop().time)
    translator = EngineEventTranslator(TranslatorConfig(worker="vllm-0", model=MODEL, block_size=BLOCK))

    def sink(events: Sequence[KVEvent]) -> None:
        for event in events:
            index.apply(event)

    source = ZmqSource(pub.pub_url, pub.replay_url, pub.topic.decode())
    task = asyncio.create_task(
        run_zmq_feed(source, translator=translator, sink=sink, status=status, timing=ZmqTiming(1.0, 0.05))
    )
    try:
        yield status
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def hits(index: MemoryKVIndex, hashes: list[int]) -> int:
    return index.longest_prefix(hashes, ["vllm-0"])["vllm-0"].gpu_blocks


async def test_a_dropped_batch_is_refilled_from_the_replay_socket() -> None:
    full = tokens(6)
    ours = chain_hashes(full, root_hash(MODEL), BLOCK)
    index = MemoryKVIndex()
    async with publisher() as pub:
        await pub.publish(array_batch(stored_array([b"a", b"b"], None, full[: 2 * BLOCK])))  # before the feed
        async with feed_into(index, pub) as status:
            await pub.wait_subscribed()
            await eventually(lambda: status.num_replays == 1)  # the start-up replay from 0 brought batch 0
            assert hits(index, ours) == 2
            await pub.publish(map_batch(stored_map([b"c"], b"b", full[2 * BLOCK : 3 * BLOCK])), drop=True)
            await pub.publish(map_batch(stored_map([b"d"], b"c", full[3 * BLOCK : 4 * BLOCK])), drop=True)
            await pub.publish(array_batch(stored_array([b"e", b"f"], b"d", full[4 * BLOCK :])))
            await eventually(lambda: hits(index, ours) == 6)
            assert (status.num_gaps, status.num_replays, status.num_resyncs) == (1, 2, 0)
            assert pub.replay_requests == [0, 1]
            await pub.publish(map_batch(removed_map([b"f"])))
            await eventually(lambda: hits(index, ours) == 5)
            assert (status.last_seq, status.num_bad_batches, status.state) == (4, 0, "flowing")


async def test_a_gap_the_replay_buffer_no_longer_holds_resyncs_the_worker() -> None:
    full = tokens(4)
    ours = chain_hashes(full, root_hash(MODEL), BLOCK)
    index = MemoryKVIndex()
    async with publisher() as pub, feed_into(index, pub) as status:
        await pub.wait_subscribed()
        await eventually(lambda: status.num_replays == 1)
        await pub.publish(array_batch(stored_array([1, 2], None, full[: 2 * BLOCK])))
        await eventually(lambda: hits(index, ours) == 2)
        lost = await pub.publish(array_batch(stored_array([3], 2, full[2 * BLOCK : 3 * BLOCK])), drop=True)
        del pub.buffer[lost]  # evicted from the engine's replay buffer
        await pub.publish(array_batch(stored_array([9], None, full[:BLOCK])))
        await eventually(lambda: status.num_resyncs == 1)
        assert hits(index, ours) == 1  # cleared, then the batch at hand applied
        assert (status.num_gaps, status.num_replays) == (1, 2)


async def test_service_follows_an_engine_with_32_token_blocks_and_reports_its_feed() -> None:
    ours = chain_hashes(tokens(2), root_hash(MODEL), BLOCK)
    quiet: list[str] = []
    async with (
        publisher() as pub,
        httpx.AsyncClient() as client,
        open_kv_service(
            state_url="memory", block_size=BLOCK, client=client, on_feed_quiet=quiet.append
        ) as service,
    ):
        service.add_engine_worker(
            "engine-0", pub.pub_url, model=MODEL, engine="vllm", replay_endpoint=pub.replay_url, topic="kv"
        )
        with pytest.raises(ValueError, match="not supported"):
            service.add_engine_worker("engine-1", "tcp://127.0.0.1:1", model=MODEL, engine="trt")
        await pub.wait_subscribed()
        engine_block = ["BlockStored", [77], None, tokens(2), 2 * BLOCK, None, "GPU"]
        await pub.publish(array_batch(engine_block))
        await eventually(lambda: service.index.longest_prefix(ours, ["engine-0"])["engine-0"].gpu_blocks == 2)
        status = service.feed_status("engine-0")
        assert status is not None
        assert (status["engine"], status["state"], status["trusted"]) == ("vllm", "flowing", True)
        assert status["sources"][0]["num_batches"] >= 1
        assert service.feed_status("nobody") is None
        service.remove_worker("engine-0")
        assert service.feed_status("engine-0") is None
    assert quiet == []

"""ZMQ subscriber for a foreign engine's KV events (vLLM, SGLang, TensorRT-LLM), with replay and resync.

The publisher sends ``[topic, seq (8 bytes BE), payload]``. With a replay endpoint (the engine's ROUTER
socket) the feed first asks for everything still buffered (from 0), and on a sequence gap asks for the
batches from ``last_seq + 1``: a DEALER sends ``[b"", start_seq (8 bytes BE)]`` and receives
``[b"", topic, seq, payload]`` per buffered batch (older engines send no topic frame), then an end marker
whose ``seq`` is -1 (signed). A gap the replay cannot fill (no replay socket, no answer within
``replay_timeout_s``, or its buffer no longer reaches back), an unreadable batch, or a sequence that went
back (the publisher restarted) is a resync: the worker's blocks are cleared (counted) and the feed goes on
from the batch at hand. Every batch updates ``FeedStatus``, which the feed ticks at least every ``tick_s``
so that a silent source turns quiet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from gateway.kvindex.feeds.decode import EventBatch, decode_event_batch
from gateway.kvindex.feeds.feed_status import FeedStatus
from gateway.kvindex.feeds.rechunk import EngineEventTranslator
from gateway.kvindex.feeds.sequence import SequenceTracker, Verdict
from kvgate_core.kvcontract.events import EventDecodeError, EventType, KVEvent

logger = logging.getLogger(__name__)

_SEQ_BYTES = 8


@dataclass(frozen=True, slots=True)
class ZmqSource:
    """Where one publisher is: its PUB endpoint, its ROUTER replay endpoint (if any) and topic."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


@dataclass(frozen=True, slots=True)
class ZmqTiming:
    """Seconds to wait for each replay reply, and between quiet checks."""

    replay_timeout_s: float = 2.0
    tick_s: float = 1.0


def parse_replay_reply(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """``(seq, payload)`` of one replay reply (``seq`` -1: the end marker); None when malformed.

    Accepts ``[b"", topic, seq, payload]`` and the topic-less ``[b"", seq, payload]``.
    """
    rest = list(frames[1:]) if frames and frames[0] == b"" else list(frames)
    if len(rest) == 3:
        rest = rest[1:]
    if len(rest) != 2 or len(rest[0]) != _SEQ_BYTES:
        return None
    return int.from_bytes(rest[0], "big", signed=True), rest[1]


def parse_live(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """``(seq, payload)`` of a published ``[topic, seq, payload]`` (or ``[seq, payload]``), else None."""
    if len(frames) not in (2, 3) or len(frames[-2]) != _SEQ_BYTES:
        return None
    return int.from_bytes(frames[-2], "big"), frames[-1]


async def run_zmq_feed(
    source: ZmqSource,
    *,
    translator: EngineEventTranslator,
    sink: Callable[[Sequence[KVEvent]], None],
    status: FeedStatus,
    timing: ZmqTiming | None = None,
    decode: Callable[[bytes], EventBatch] = decode_event_batch,
) -> None:
    """Subscribe to ``source`` and feed translated events to ``sink`` until cancelled.

    Raises:
        zmq.ZMQError: an endpoint is malformed (the caller retries or gives up).
    """
    ctx = zmq.asyncio.Context()
    feed = _Feed(ctx, source, translator, sink, status, timing or ZmqTiming(), decode)
    try:
        await feed.run()
    finally:
        feed.close()
        ctx.term()


class _Feed:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        source: ZmqSource,
        translator: EngineEventTranslator,
        sink: Callable[[Sequence[KVEvent]], None],
        status: FeedStatus,
        timing: ZmqTiming,
        decode: Callable[[bytes], EventBatch],
    ) -> None:
        self._ctx, self._source, self._timing = ctx, source, timing
        self._translator, self._sink, self._status, self._decode = translator, sink, status, decode
        self._seq = SequenceTracker()
        self._sub: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None

    async def run(self) -> None:
        sub = self._sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self._source.topic.encode())
        sub.connect(self._source.endpoint)
        if self._source.replay_endpoint is not None:
            await self._replay(0)
        tick_ms = int(self._timing.tick_s * 1000)
        while True:
            if await sub.poll(tick_ms):
                await self._on_live(await sub.recv_multipart())
            self._status.tick()

    async def _on_live(self, frames: Sequence[bytes]) -> None:
        parsed = parse_live(frames)
        if parsed is None:
            self._bad("malformed message")
            return
        seq, payload = parsed
        verdict = self._seq.classify_live(seq)
        if verdict is Verdict.GAP:
            self._status.num_gaps += 1
            logger.warning(
                "KV events from %s: sequence gap %d -> %d", self._source.endpoint, self._seq.last, seq
            )
            await self._replay(self._seq.last + 1)
            verdict = self._seq.classify_live(seq)
        if verdict is Verdict.DUPLICATE:
            return
        if verdict is Verdict.GAP:
            self._resync("a sequence gap that no replay filled")
        elif verdict is Verdict.RESTART:
            self._resync("the sequence went back (the publisher restarted)")
        self._apply(payload)
        self._seq.applied(seq, live=True)
        self._status.last_seq = seq

    async def _replay(self, start: int) -> None:
        """Apply the replay socket's batches from ``start``; on no answer, return (the caller resyncs)."""
        if self._source.replay_endpoint is None:
            return
        dealer = self._dealer = self._dealer or self._connect_dealer(self._source.replay_endpoint)
        timeout_ms = int(self._timing.replay_timeout_s * 1000)
        try:
            await asyncio.wait_for(
                dealer.send_multipart([b"", start.to_bytes(_SEQ_BYTES, "big")]), self._timing.replay_timeout_s
            )
            while await dealer.poll(timeout_ms):
                reply = parse_replay_reply(await dealer.recv_multipart())
                if reply is None:
                    self._bad("malformed replay reply")
                    continue
                seq, payload = reply
                if seq < 0:
                    self._status.num_replays += 1
                    return
                self._on_replayed(seq, payload)
        except TimeoutError:
            pass
        logger.warning("KV events from %s: replay socket did not answer", self._source.replay_endpoint)
        self._close_dealer()  # a late answer must not be read as the next replay's

    def _on_replayed(self, seq: int, payload: bytes) -> None:
        verdict = self._seq.classify_replayed(seq)
        if verdict is Verdict.DUPLICATE:
            return
        if verdict is Verdict.GAP:
            self._resync("the replay buffer no longer holds the missing batches")
        self._apply(payload)
        self._seq.applied(seq, live=False)
        self._status.last_seq = seq

    def _apply(self, payload: bytes) -> None:
        self._status.note_batch()
        try:
            batch = self._decode(payload)
        except EventDecodeError as exc:
            self._bad(str(exc))
            self._resync("an unreadable batch")
            return
        events = self._translator.translate(batch.events, batch.ts)
        if events:
            self._sink(events)

    def _resync(self, why: str) -> None:
        self._status.num_resyncs += 1
        worker = self._translator.config.worker
        logger.warning("KV events of worker %s: resync after %s: its cached blocks are cleared", worker, why)
        self._translator.reset()
        self._sink([KVEvent(worker=worker, type=EventType.CLEARED)])

    def _bad(self, why: str) -> None:
        self._status.num_bad_batches += 1
        n = self._status.num_bad_batches
        if n & (n - 1) == 0:  # 1, 2, 4, 8…: never a flood
            logger.warning("bad KV event batch #%d from %s: %s", n, self._source.endpoint, why)

    def _connect_dealer(self, endpoint: str) -> zmq.asyncio.Socket:
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.connect(endpoint)
        return dealer

    def _close_dealer(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None

    def close(self) -> None:
        self._close_dealer()
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

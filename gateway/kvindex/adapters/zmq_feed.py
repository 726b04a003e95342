"""ZMQ SUB consumer for a foreign engine's KV events (vLLM, SGLang): decode, re-hash, hand to a sink.

The engine's publisher sends ``[topic, seq (8 bytes, big-endian), payload]`` multipart messages; a gap in
``seq`` means the SUB socket dropped messages (slow consumer or reconnect): it is counted and logged, and
the index converges again as blocks are re-stored (the engine's replay socket is not used).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from gateway.kvindex.adapters.vllm import EngineEvent, EngineEventTranslator
from kvgate_core.kvcontract.events import EventDecodeError, KVEvent

logger = logging.getLogger(__name__)


@dataclass
class ZmqFeedStats:
    """Counters of one feed (read them for metrics)."""

    num_batches: int = 0
    num_bad_batches: int = 0
    num_gaps: int = 0
    last_seq: int = -1


async def run_zmq_feed(
    *,
    endpoint: str,
    decode: Callable[[bytes], list[EngineEvent]],
    translator: EngineEventTranslator,
    sink: Callable[[Sequence[KVEvent]], None],
    topic: bytes = b"",
    stats: ZmqFeedStats | None = None,
) -> None:
    """Subscribe to ``endpoint`` and feed translated events to ``sink`` until cancelled.

    Args:
        endpoint: the engine's PUB address, e.g. ``tcp://10.0.0.5:5557``.
        decode: ``vllm.decode_batch`` or ``sglang.decode_sglang_batch``.
        translator: the engine's translator (worker id, model, block size).
        sink: receives each batch's kvgate events, e.g. ``index.apply`` over them.
        topic: ZMQ subscription prefix (the engine's ``topic``; empty for all).
        stats: counters to update.
    """
    counters = stats if stats is not None else ZmqFeedStats()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    try:
        sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.connect(endpoint)
        while True:
            frames = await sock.recv_multipart()
            _note_seq(frames, counters)
            try:
                events = translator.translate(decode(frames[-1]))
            except (EventDecodeError, ValueError, TypeError) as exc:
                counters.num_bad_batches += 1
                logger.warning("bad KV event batch from %s: %s", endpoint, exc)
                continue
            counters.num_batches += 1
            if events:
                sink(events)
    finally:
        sock.close(linger=0)
        ctx.term()


def _note_seq(frames: Sequence[bytes], stats: ZmqFeedStats) -> None:
    if len(frames) < 3 or len(frames[1]) != 8:
        return
    seq = int.from_bytes(frames[1], "big")
    if stats.last_seq >= 0 and seq != stats.last_seq + 1:
        stats.num_gaps += 1
        logger.warning("KV event sequence gap: %d -> %d", stats.last_seq, seq)
    stats.last_seq = seq

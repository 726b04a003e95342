"""A ZMQ KV-event publisher in the framing vLLM and SGLang share (vLLM's ``vllm/distributed/kv_events.py``, SGLang's ``srt/disaggregation/kv_events.py``).

- PUB multipart ``(topic, seq.to_bytes(8, "big"), payload)``; ``seq`` counts from 0 per publisher.
- ``payload`` = msgpack ``[ts, events, dp_rank]``; the events are what ``encode`` makes of a cache change
  (tagged maps for SGLang 0.5.23).
- Like both engines, the PUB socket *binds* when the endpoint host is a wildcard (``tcp://*:P``) and
  *connects* otherwise; the fake binds a wildcard on 127.0.0.1 only.
- Replay: a ROUTER socket; a request ``(identity, b"", start_seq 8 bytes BE)`` is answered with
  ``(identity, b"", topic, seq8, payload)`` for every buffered batch with ``seq >= start_seq``, then the end
  marker ``(identity, b"", b"", (-1).to_bytes(8, "big", signed=True), b"")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import zmq

from tests.support.engines.cache import Block

END_SEQ = (-1).to_bytes(8, "big", signed=True)
#: Turns one cache change (stored, removed, cleared) into the engine's event objects.
Encode = Callable[[Sequence[Block], Sequence[Block], bool], list[Any]]


def loopback(endpoint: str) -> str:
    """``endpoint`` with a wildcard host replaced by 127.0.0.1 (the fakes never listen beyond loopback)."""
    return endpoint.replace("://*:", "://127.0.0.1:").replace("://0.0.0.0:", "://127.0.0.1:")


class ZmqKVPublisher:
    """Publishes cache changes as KV-event batches (a ``core.CacheListener``).

    Args:
        endpoint: the PUB endpoint as configured (``tcp://*:5557``).
        replay_endpoint: the ROUTER endpoint, or None for no replay.
        encode: the engine's event encoding.
        topic: the topic frame.
        buffer_steps: batches kept for replay.
        dp_rank: the third element of every batch.
    """

    def __init__(
        self, endpoint: str, replay_endpoint: str | None, encode: Encode, *, topic: str = "",
        buffer_steps: int = 10_000, dp_rank: int = 0,
    ) -> None:  # fmt: skip
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._encode = encode
        self._topic = topic.encode()
        self._dp_rank = dp_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.Socket[bytes] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Open the sockets and the replay service (inside the running event loop)."""
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        if "*" in self.endpoint or "0.0.0.0" in self.endpoint:
            self._pub.bind(loopback(self.endpoint))
        else:
            self._pub.connect(self.endpoint)
        if self.replay_endpoint is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.bind(loopback(self.replay_endpoint))
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._ctx = self._pub = self._router = None

    def on_cache_events(self, stored: Sequence[Block], removed: Sequence[Block], cleared: bool) -> None:
        events = self._encode(stored, removed, cleared)
        if not events or self._pub is None:
            return
        payload = msgpack.packb([time.time(), events, self._dp_rank])
        seq, self._seq = self._seq, self._seq + 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            while router.poll(0):
                frames = router.recv_multipart(flags=zmq.NOBLOCK)
                if len(frames) != 3:
                    continue
                identity, _, start = frames
                first = int.from_bytes(start, "big")
                for seq, payload in list(self._buffer):
                    if seq >= first:
                        router.send_multipart([identity, b"", self._topic, seq.to_bytes(8, "big"), payload])
                router.send_multipart([identity, b"", b"", END_SEQ, b""])
            await asyncio.sleep(0.02)

"""Redis backplane of the KV service: the stream reader feeding the local copy, and per-worker relays.

Roles per worker, decided every ``lease_s / 3`` seconds:

- ``lead``: this replica holds the worker's relay lease; it follows the worker's SSE feed and publishes
  the snapshot and the events to the stream (all replicas, itself included, apply them from there).
- ``follow``: another replica relays; this one only reads the stream.
- ``local``: Redis is unreachable; this replica follows the worker directly into its local copy, so
  routing keeps precise data while degraded. When Redis returns, one replica leads again and re-publishes
  a snapshot.

Imported only for ``redis://`` state (it imports the Redis client).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum

import httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.kvindex.backplane.shared_predictions import ROUTED_STREAM, Routed, decode_routed, encode_routed
from gateway.kvindex.backplane.stream import (
    StreamReader,
    claim_relay,
    last_entry_id,
    publish_events,
    raise_if_cancelling,
    release_relay,
)
from gateway.kvindex.feeds.kvgate import (
    BlocksSnapshot,
    EventsSink,
    FeedConfig,
    fetch_snapshot,
    run_worker_feed,
)
from gateway.state.lag import LagRecorder
from kvgate_core.kvcontract.events import KVEvent

logger = logging.getLogger(__name__)

SnapshotSink = Callable[[BlocksSnapshot], Awaitable[None]]
_REDIS_DOWN = (RedisError, OSError)


class Role(Enum):
    LEAD = "lead"
    FOLLOW = "follow"
    LOCAL = "local"


class _Lost:
    """Set by a lead's sinks when an event could not be published (the stream has a gap)."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events = False


class RedisBackplane:
    """Keeps a replica's local index in step with the fleet through Redis; see the module docstring."""

    def __init__(
        self,
        *,
        redis: Redis,
        client: httpx.AsyncClient,
        feed: FeedConfig,
        apply: Callable[[Sequence[KVEvent]], None],
        on_routed: Callable[[str, Sequence[int]], None],
        clock: Callable[[], float],
        token: str,
        lease_s: float,
        maxlen: int,
        warn_interval_s: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._wall = wall_clock
        self._outbox_since = 0.0  # wall time the oldest queued prediction was queued
        #: how old other replicas' predictions were when this one applied them
        self.prediction_lag = LagRecorder()
        #: how long after a relaying replica (this one included) received worker events they were applied here
        self.event_lag = LagRecorder()
        self._client = client
        self._feed = feed
        self._apply = apply
        self._on_routed = on_routed
        self._outbox: list[Routed] = []
        self._outbox_ready = asyncio.Event()
        self._routed_reader: StreamReader | None = None
        self._leading: set[str] = set()
        self._clock = clock
        self._token = token
        self._lease_s = lease_s
        self._maxlen = maxlen
        self._warn_interval_s = warn_interval_s
        self._last_warning = float("-inf")
        self._reader: StreamReader | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.degraded = False

    @property
    def reader(self) -> StreamReader | None:
        return self._reader

    async def start(self, tasks: asyncio.TaskGroup) -> None:
        """Find the stream positions to read from and start the reader and publisher tasks."""
        try:
            start_id = await last_entry_id(self._redis)
            routed_id = await last_entry_id(self._redis, ROUTED_STREAM)
        except _REDIS_DOWN as exc:
            self.mark_down(exc)
            start_id = routed_id = b"0-0"
        self._reader = StreamReader(
            self._redis, self._apply, start_id=start_id, lag=self.event_lag, wall_clock=self._wall
        )
        self._routed_reader = StreamReader(
            self._redis, stream=ROUTED_STREAM, start_id=routed_id, on_payload=self._apply_routed
        )
        self._tasks = [
            tasks.create_task(self._read_loop(self._reader), name="kv-stream-reader"),
            tasks.create_task(self._read_loop(self._routed_reader), name="kv-routed-reader"),
            tasks.create_task(self._publish_routed_loop(), name="kv-routed-publisher"),
        ]

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def release_leases(self) -> None:
        """Hand back the relay leases this replica holds (on shutdown), so others take over at once."""
        for worker_id in list(self._leading):
            try:
                await release_relay(self._redis, worker_id, self._token)
            except _REDIS_DOWN:
                return
        self._leading.clear()

    def note_routed(self, worker: str, hashes: Sequence[int]) -> None:
        """Queue a routing prediction for the other replicas (synchronous, O(1))."""
        if not self._outbox:
            self._outbox_since = self._wall()
        self._outbox.append((worker, tuple(hashes)))
        self._outbox_ready.set()

    def _apply_routed(self, data: bytes) -> None:
        replica, items, queued_at = decode_routed(data)
        if replica != self._token:
            if queued_at is not None:
                self.prediction_lag.observe(self._wall() - queued_at)
            for worker, hashes in items:
                self._on_routed(worker, hashes)

    async def _publish_routed_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            batch, self._outbox = self._outbox, []
            if not batch:
                continue
            payload = encode_routed(self._token, batch, self._outbox_since)
            try:
                await self._redis.xadd(ROUTED_STREAM, {b"e": payload}, maxlen=10_000, approximate=True)
            except _REDIS_DOWN as exc:  # predictions are hints: drop them rather than queue them
                self.mark_down(exc)
            raise_if_cancelling()

    def mark_down(self, exc: BaseException) -> None:
        """Record that Redis failed; warn at most once per interval."""
        self.degraded = True
        now = self._clock()
        if now - self._last_warning >= self._warn_interval_s:
            self._last_warning = now
            logger.warning("Redis state unreachable (%s): routing on the local KV index copy", exc)

    async def _read_loop(self, reader: StreamReader) -> None:
        delay = self._feed.backoff_initial_s
        while True:
            try:
                await reader.read_once()
            except _REDIS_DOWN as exc:
                raise_if_cancelling()
                self.mark_down(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._feed.backoff_max_s)
                continue
            except Exception:  # task boundary: a bad entry must not stop the reader
                logger.exception("KV stream reader failed at %s; skipping on", reader.last_id)
            raise_if_cancelling()
            if self.degraded:
                logger.warning("Redis state reachable again: KV index follows the shared stream")
            self.degraded = False
            delay = self._feed.backoff_initial_s

    async def follow_worker(self, worker_id: str, url: str, local: tuple[SnapshotSink, EventsSink]) -> None:
        """Per-worker loop: a local snapshot first, then lead/follow/local as the lease and Redis allow."""
        has_snapshot = await self._try_local_snapshot(url, local[0])
        renew_s = self._lease_s / 3
        while True:
            role = await self._claim(worker_id)
            raise_if_cancelling()
            if role is Role.FOLLOW:
                if not has_snapshot:
                    has_snapshot = await self._try_local_snapshot(url, local[0])
                await asyncio.sleep(renew_s)
                continue
            lost = _Lost()
            sinks = local if role is Role.LOCAL else self._lead_sinks(local, lost)
            feed = asyncio.ensure_future(
                run_worker_feed(url=url, client=self._client, config=self._feed, on_snapshot=sinks[0],
                                on_events=sinks[1])
            )  # fmt: skip
            try:
                has_snapshot = True
                while not feed.done():
                    await asyncio.sleep(renew_s)
                    if await self._claim(worker_id) is not role:
                        break
                    raise_if_cancelling()
                    if lost.events:
                        # A publish failed, yet the lease renewed: the outage fell between two renewals.
                        # The stream missed events, so lead afresh from a new snapshot.
                        break
            finally:
                feed.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feed

    async def _claim(self, worker_id: str) -> Role:
        try:
            held = await claim_relay(self._redis, worker_id, self._token, int(self._lease_s * 1000))
        except _REDIS_DOWN as exc:
            self.mark_down(exc)
            return Role.LOCAL
        if held:
            self._leading.add(worker_id)
            return Role.LEAD
        self._leading.discard(worker_id)
        return Role.FOLLOW

    async def _try_local_snapshot(self, url: str, sink: SnapshotSink) -> bool:
        try:
            await sink(await fetch_snapshot(self._client, url))
        except (httpx.HTTPError, ValueError) as exc:
            logger.info("no /kv/blocks snapshot from %s yet (%s)", url, exc)
            return False
        return True

    def _lead_sinks(
        self, local: tuple[SnapshotSink, EventsSink], lost: _Lost
    ) -> tuple[SnapshotSink, EventsSink]:
        local_snapshot, local_events = local

        async def on_snapshot(snapshot: BlocksSnapshot) -> None:
            await local_snapshot(snapshot)  # learns the alias; the stream repeats it harmlessly
            await on_events(snapshot.as_events(snapshot.worker))

        async def on_events(events: Sequence[KVEvent]) -> None:
            try:
                await publish_events(self._redis, events, maxlen=self._maxlen, received_at=self._wall())
            except _REDIS_DOWN as exc:
                self.mark_down(exc)
                lost.events = True
                await local_events(events)
            raise_if_cancelling()

        return on_snapshot, on_events

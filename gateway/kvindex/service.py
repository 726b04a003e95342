"""The KV service: the index a gateway looks up, plus the background feeds that keep it current.

The KV index's three rooms: the index itself (``index``, ``memory``, ``approximate``, ``hybrid`` …),
``feeds/`` (everything that turns a worker's or an engine's events into index updates, one module per
source format: kvgate workers' SSE in ``feeds/kvgate.py``, vLLM/SGLang ZMQ, TensorRT-LLM's HTTP drain, and
the foreign engines' supervision in ``feeds/engines.py``) and ``backplane/`` (what replicas share through
Redis: the events stream, the relay, the shared predictions). ``open_kv_service`` picks the wiring from the
state URL:

- ``memory``: one SSE feed per worker (``feeds/kvgate.py``) applies events straight to the index.
- ``redis://…``: every replica keeps a local ``MemoryKVIndex`` (a lookup never waits on Redis), fed by the
  ``kvgate:events`` stream. One replica per worker (``backplane/stream.py``: ``claim_relay``) relays the
  worker's SSE feed to the stream; each replica also takes a ``/kv/blocks`` snapshot at start so a
  restarted gateway rebuilds. Routing predictions are shared between replicas too
  (``backplane/shared_predictions.py``).
  Redis down: ``degraded`` is set, a warning is logged once per interval, and every replica follows the
  workers' SSE feeds directly until Redis answers again; lookups go on from the local copy.

With ``KVServiceConfig.approximate`` set the index is an ``ApproximateKVIndex`` fed only by routing.
Policies and metrics live elsewhere (``policies/``, ``observability/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from gateway.kvindex.approximate import ApproximateIndexConfig, ApproximateKVIndex
from gateway.kvindex.backplane.shared_predictions import ReplicatedKVIndex
from gateway.kvindex.backplane.stream import wait_for_entry
from gateway.kvindex.capacity import CapacityConfig, CapacityLearner
from gateway.kvindex.feeds.discovery import EventSource
from gateway.kvindex.feeds.engines import EngineFeedConfig, EngineFeeds
from gateway.kvindex.feeds.feed_status import DEFAULT_QUIET_AFTER_S
from gateway.kvindex.feeds.kvgate import (
    AliasMap,
    BlocksSnapshot,
    EventsSink,
    FeedConfig,
    fetch_snapshot,
    run_worker_feed,
)
from gateway.kvindex.feeds.trtllm_http import DrainError
from gateway.kvindex.hybrid import HybridKVIndex, IndexMode
from gateway.kvindex.index import KVIndex
from gateway.kvindex.memory import MemoryIndexConfig, MemoryKVIndex
from gateway.state.lag import LagRecorder
from gateway.state.redis_client import is_redis_url, open_redis
from kvgate_core.kvcontract.events import KVEvent

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from gateway.kvindex.backplane.relay import RedisBackplane, SnapshotSink

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KVServiceConfig:
    """Tuning of the KV service; the defaults need no change.

    Attributes:
        index: limits of the precise index (memory budget, prediction TTL).
        approximate: set for backends without KV events: the index is then guessed from routing.
        follow_fleet: each worker's mode follows its KV-event feed (``HybridKVIndex``): precise while one
            flows, approximate (tuned by ``approximate``'s limits, defaults when None) where none does or it
            went quiet. False with ``approximate`` None: precise for all, and a quiet feed's worker gets no
            hits at all.
        backoff_initial_s: first reconnect delay of a worker feed or of the Redis reader.
        backoff_max_s: cap of the reconnect delay.
        relay_lease_s: lease of a replica on relaying one worker's events to Redis.
        stream_maxlen: approximate cap of the Redis stream.
        degraded_warn_interval_s: at most one "Redis unreachable" warning per interval.
        feed_quiet_after_s: a foreign engine's event source without a batch for this long (after requests
            were routed to its worker, when the service is given ``activity``) is quiet (its
            worker's blocks are no longer trusted; see ``KVService.feed_trusted``).
        units: how each worker's tokens and assumed cache are learned (``CapacityLearner``).
    """

    index: MemoryIndexConfig = field(default_factory=MemoryIndexConfig)
    approximate: ApproximateIndexConfig | None = None
    follow_fleet: bool = False
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    relay_lease_s: float = 5.0
    stream_maxlen: int = 100_000
    degraded_warn_interval_s: float = 30.0
    feed_quiet_after_s: float = DEFAULT_QUIET_AFTER_S
    units: CapacityConfig = field(default_factory=CapacityConfig)


class KVService:
    """The index plus the worker feeds that keep it current; built by ``open_kv_service``.

    ``add_worker``/``add_engine_worker``/``add_trtllm_worker``/``remove_worker`` are synchronous: they
    start or stop background tasks owned by the service's task group. ``index`` lookups are synchronous and
    in-process. Foreign engines' feeds report their state (``feed_status``, ``feed_trusted``, and
    ``open_kv_service``'s ``on_feed_quiet``/``on_feed_flowing`` callbacks).
    """

    def __init__(
        self,
        *,
        index: KVIndex,
        client: httpx.AsyncClient,
        feed: FeedConfig,
        tasks: asyncio.TaskGroup,
        backplane: RedisBackplane | None,
        engine_feeds: EngineFeeds | None = None,
        units: CapacityConfig | None = None,
    ) -> None:
        self.index: KVIndex = index
        self.is_approximate = isinstance(index, ApproximateKVIndex)
        self.hybrid = index if isinstance(index, HybridKVIndex) else None
        approximate = self.hybrid.approximate if self.hybrid is not None else index
        #: each worker's units and assumed cache size (None: no approximate index)
        self.units = (
            CapacityLearner(approximate, block_size=feed.block_size, config=units)
            if isinstance(approximate, ApproximateKVIndex)
            else None
        )
        self.aliases = AliasMap()
        self._client = client
        self._feed = feed
        self._tasks = tasks
        self._backplane = backplane
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._engines = engine_feeds or EngineFeeds(EngineFeedConfig(feed.block_size), clock=time.monotonic)

    def worker_mode(self, worker_id: str) -> IndexMode:
        """Where the worker's prefix hits come from: ``precise``, ``approximate`` or ``none``."""
        if self.hybrid is not None:
            return self.hybrid.mode(worker_id)
        return "approximate" if self.is_approximate else "precise"

    def set_mode(self, worker_id: str, mode: IndexMode) -> bool:
        """Switch one worker's index mode (only when the mode follows the fleet); True when it changed."""
        if self.hybrid is None:
            return False
        changed = self.hybrid.set_mode(worker_id, mode)
        if changed:
            logger.info("KV index mode of worker %s: %s", worker_id, mode)
        return changed

    @property
    def quiet_mode(self) -> IndexMode:
        """The mode of a worker whose feed went quiet: approximate when the mode follows the fleet."""
        if self.hybrid is not None and self.hybrid.follows_fleet:
            return "approximate"
        return "none"

    def set_capacity(self, worker_id: str, tokens: int) -> None:
        """The worker's engine keeps ``tokens`` of its own tokens of KV: size its assumed cache from it (in
        the gateway's blocks, once the units are learned)."""
        if self.units is not None:
            self.units.set_engine_capacity(worker_id, tokens)

    def units_status(self, worker_id: str) -> dict[str, Any] | None:
        """The worker's learned units and assumed cache (``/admin/workers``); None before anything was."""
        units = self.units.units(worker_id) if self.units is not None else None
        return units.as_dict() if units is not None else None

    def engine_tokens(self, worker_id: str, gateway_tokens: int) -> int:
        """``gateway_tokens`` counted in the worker's engine tokens (``TokenUnits``)."""
        if self.units is None:
            return gateway_tokens
        return self.units.engine_tokens(worker_id, gateway_tokens)

    def observe_finished(
        self,
        worker_id: str,
        *,
        gateway_prompt_tokens: int,
        engine_prompt_tokens: int | None,
        predicted_tokens: int,
        reported_tokens: int | None,
        tolerance_tokens: int,
    ) -> None:
        """One finished request (``TokenUnits``): learn the worker's units and, where its placement is learned
        from routing, correct its assumed cache from the prediction against the report."""
        if self.units is not None:
            self.units.observe(
                worker_id, gateway_prompt_tokens=gateway_prompt_tokens,
                engine_prompt_tokens=engine_prompt_tokens, predicted_tokens=predicted_tokens,
                reported_tokens=reported_tokens, tolerance_tokens=tolerance_tokens,
                learn_capacity=self.worker_mode(worker_id) == "approximate",
            )  # fmt: skip

    @property
    def degraded(self) -> bool:
        """True while the shared state (Redis) is unreachable; always false for ``memory``."""
        return self._backplane is not None and self._backplane.degraded

    def replica_lags(self) -> dict[str, LagRecorder]:
        """How late what other replicas share arrives here (empty without a Redis backplane): ``prediction``,
        their routing predictions; ``kv_events``, worker events from the replica that relays them (this one
        included) to this index."""
        if self._backplane is None:
            return {}
        return {"prediction": self._backplane.prediction_lag, "kv_events": self._backplane.event_lag}

    def attach(self, backplane: RedisBackplane) -> None:
        """Route worker feeds through a Redis backplane (before any ``add_worker``)."""
        self._backplane = backplane

    @property
    def workers(self) -> dict[str, asyncio.Task[None]]:
        return self._workers

    def add_worker(self, worker_id: str, url: str) -> None:
        """Start following a worker (idempotent for the same id): its snapshot, then its events.

        Args:
            worker_id: the gateway registry's id; events carrying the worker's self-reported id are
                translated to it once the worker's ``/kv/blocks`` has been read.
            url: the worker's base URL.
        """
        if worker_id in self._workers or self.is_approximate:
            return
        if self._backplane is not None:
            coro = self._backplane.follow_worker(worker_id, url, self._local_sinks(worker_id))
        else:
            on_snapshot, on_events = self._local_sinks(worker_id)
            coro = run_worker_feed(
                url=url, client=self._client, config=self._feed, on_snapshot=on_snapshot, on_events=on_events
            )
        self._workers[worker_id] = self._tasks.create_task(coro, name=f"kv-feed-{worker_id}")
        logger.info("following KV events of worker %s at %s", worker_id, url)

    def add_engine_worker(
        self,
        worker_id: str,
        endpoint: str,
        *,
        model: str,
        engine: str = "vllm",
        replay_endpoint: str | None = None,
        topic: str = "",
    ) -> None:
        """Follow a foreign engine's ZMQ KV events (vLLM, SGLang, TensorRT-LLM), re-hashed into our scheme.

        ``endpoint``/``replay_endpoint``: the engine's PUB and ROUTER addresses (wildcard host replaced);
        ``model``: the root model name the gateway hashes its prompts with; ``engine``: an ``EngineKind``
        value. Each replica subscribes itself. Block sizes come with the events (re-chunked to ours).

        Raises:
            ValueError: ``engine`` publishes no ZMQ events.
        """
        self.add_event_sources(
            worker_id, [EventSource(endpoint, replay_endpoint, topic)], model=model, engine=engine
        )

    def add_event_sources(
        self, worker_id: str, sources: Sequence[EventSource], *, model: str, engine: str = "vllm"
    ) -> None:
        """Follow all of an engine's ZMQ publishers (one per DP rank, from ``discover_event_sources``).

        Idempotent for the same id. Raises ``ValueError`` as ``add_engine_worker`` (or with no source).
        """
        if worker_id in self._workers:
            return
        coro = self._engines.zmq(worker_id, sources, model=model, engine=str(engine), sink=self.apply_local)
        self._workers[worker_id] = self._tasks.create_task(coro, name=f"kv-zmq-{worker_id}")
        logger.info(
            "following %s KV events of worker %s at %s",
            engine,
            worker_id,
            ", ".join(s.endpoint for s in sources),
        )

    def add_trtllm_worker(
        self, worker_id: str, url: str, model: str, *, block_size: int | None = None
    ) -> None:
        """Follow a TensorRT-LLM worker's KV events by polling its HTTP drain ``POST /kv_cache_events``.

        The drain is destructive: only one gateway process may poll a worker. ``block_size``: the
        engine's ``tokens_per_block`` when known (else learned from the events).
        """
        if worker_id in self._workers:
            return
        coro = self._engines.trtllm(
            worker_id, url, model=model, post=self._drain_post, sink=self.apply_local, block_size=block_size
        )
        self._workers[worker_id] = self._tasks.create_task(coro, name=f"kv-trtllm-{worker_id}")
        logger.info("polling TensorRT-LLM KV events of worker %s at %s", worker_id, url)

    async def _drain_post(self, url: str) -> Any:
        try:
            response = await self._client.post(url)
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise DrainError(str(exc) or type(exc).__name__) from exc

    def feed_status(self, worker_id: str) -> dict[str, Any] | None:
        """The engine feed status for ``/admin/workers`` (``WorkerFeeds.as_dict``); None without one."""
        return self._engines.status(worker_id)

    def feed_trusted(self, worker_id: str) -> bool:
        """False while the worker's engine feed is quiet or stopped: route as if its blocks were unknown."""
        return self._engines.trusted(worker_id)

    def apply_local(self, events: Sequence[KVEvent]) -> None:
        """Apply events already carrying registry ids (a foreign engine's feed) to the index."""
        for event in events:
            self.index.apply(event)

    def remove_worker(self, worker_id: str) -> None:
        """Stop following a worker and forget its blocks."""
        task = self._workers.pop(worker_id, None)
        if task is not None:
            task.cancel()
        self._engines.remove(worker_id)
        self.aliases.forget(worker_id)
        self.index.remove_worker(worker_id)
        if self.units is not None:
            self.units.forget(worker_id)

    async def wait_for_stream(self, entry_id: bytes, timeout_s: float = 10.0) -> None:
        """Until this replica has applied the stream entry ``entry_id`` (a barrier for tests and tools).

        Raises:
            RuntimeError: the service has no Redis backplane.
            TimeoutError: not reached within ``timeout_s``.
        """
        reader = self._backplane.reader if self._backplane is not None else None
        if reader is None:
            raise RuntimeError("wait_for_stream needs redis:// state")
        await wait_for_entry(reader, entry_id, timeout_s)

    async def snapshot_worker(self, worker_id: str, url: str) -> None:
        """Rebuild one worker's entries from its ``/kv/blocks`` now (on demand; feeds do it on connect)."""
        on_snapshot, _ = self._local_sinks(worker_id)
        await on_snapshot(await fetch_snapshot(self._client, url))

    def _local_sinks(self, worker_id: str) -> tuple[SnapshotSink, EventsSink]:
        async def on_snapshot(snapshot: BlocksSnapshot) -> None:
            self.aliases.learn(snapshot.worker, worker_id)
            for event in snapshot.as_events(worker_id):
                self.index.apply(event)

        async def on_events(events: Sequence[KVEvent]) -> None:
            self.apply_events(events)

        return on_snapshot, on_events

    def apply_events(self, events: Sequence[KVEvent]) -> None:
        """Apply events carrying self-reported worker ids to the local index."""
        apply = self.index.apply
        for event in self.aliases.translate(events):
            apply(event)


@contextlib.asynccontextmanager
async def open_kv_service(
    *,
    state_url: str,
    block_size: int,
    client: httpx.AsyncClient,
    redis: Redis | None = None,
    clock: Callable[[], float] = time.monotonic,
    config: KVServiceConfig | None = None,
    on_evict: Callable[[int], None] | None = None,
    on_feed_quiet: Callable[[str], None] | None = None,
    on_feed_flowing: Callable[[str], None] | None = None,
    activity: Callable[[str], int] | None = None,
) -> AsyncIterator[KVService]:
    """Run the KV service for the lifetime of the context.

    Args:
        state_url: ``memory`` or ``redis://host:port/db``.
        block_size: the gateway's block size; a worker reporting another one is not indexed.
        redis: the gateway's one Redis client (``State.redis``): the backplane runs on it and leaves it
            open. When None, a ``redis://`` ``state_url`` opens a client of the service's own
            (``gateway.state.redis_client.open_redis``, closed on exit), for the service run alone.
        client: shared HTTP client for ``/kv/blocks`` and ``/kv/events``.
        clock: monotonic seconds (prediction TTLs, approximate TTLs, warning intervals).
        config: tuning; defaults when omitted.
        on_evict: metric hook called with the number of blocks the memory budget evicted.
        on_feed_quiet: called with a worker id when its foreign engine's event feed turns quiet (its blocks
            are no longer trusted: route it as if they were unknown).
        on_feed_flowing: called with a worker id when that feed flows (again).
        activity: requests routed to a worker so far, by id: a feed turns quiet only when requests went
            there and no events followed (an idle engine publishes nothing). None: silence alone.

    Raises:
        ValueError: the state URL is neither ``memory`` nor ``redis://``/``rediss://``/``unix://``.
    """
    cfg = config or KVServiceConfig()
    index: KVIndex
    if cfg.follow_fleet:
        index = HybridKVIndex(
            MemoryKVIndex(cfg.index, clock=clock, on_evict=on_evict),
            ApproximateKVIndex(cfg.approximate, clock=clock),
            default="approximate",
        )
    elif cfg.approximate is not None:
        index = ApproximateKVIndex(cfg.approximate, clock=clock)
    else:
        index = HybridKVIndex(
            MemoryKVIndex(cfg.index, clock=clock, on_evict=on_evict),
            ApproximateKVIndex(clock=clock),
            default="precise",
        )
    feed = FeedConfig(block_size, cfg.backoff_initial_s, cfg.backoff_max_s)
    shared = _is_redis_state(state_url)
    async with contextlib.AsyncExitStack() as owned:
        if redis is None and shared:
            redis = await owned.enter_async_context(open_redis(state_url))
        async with asyncio.TaskGroup() as tasks:
            backplane = None
            engines = EngineFeeds(
                EngineFeedConfig(
                    block_size=block_size, quiet_after_s=cfg.feed_quiet_after_s,
                    backoff_initial_s=cfg.backoff_initial_s, backoff_max_s=cfg.backoff_max_s,
                ),
                clock=clock, on_quiet=on_feed_quiet, on_flowing=on_feed_flowing, activity=activity,
            )  # fmt: skip
            service = KVService(
                index=index, client=client, feed=feed, tasks=tasks, backplane=None, engine_feeds=engines,
                units=cfg.units,
            )  # fmt: skip
            if redis is not None:
                from gateway.kvindex.backplane.relay import RedisBackplane

                local = index
                backplane = RedisBackplane(
                    redis=redis, client=client, feed=feed, apply=service.apply_events,
                    on_routed=local.record_routed, clock=clock, token=uuid.uuid4().hex,
                    lease_s=cfg.relay_lease_s, maxlen=cfg.stream_maxlen,
                    warn_interval_s=cfg.degraded_warn_interval_s,
                )  # fmt: skip
                service.index = ReplicatedKVIndex(local, backplane.note_routed)
                service.attach(backplane)
                await backplane.start(tasks)
            # The caller's exception is held back until the task group has closed: raised inside it, it
            # would come out wrapped in an ExceptionGroup and change the caller's error handling.
            body_error: BaseException | None = None
            try:
                yield service
            except BaseException as exc:  # noqa: BLE001 - re-raised unchanged below
                body_error = exc
            finally:
                if backplane is not None:
                    backplane.stop()
                for task in list(service.workers.values()):
                    task.cancel()
        if backplane is not None:
            await backplane.release_leases()
        if body_error is not None:
            raise body_error


def _is_redis_state(state_url: str) -> bool:
    if state_url == "memory":
        return False
    if not is_redis_url(state_url):
        raise ValueError(f"state URL {state_url!r}: use 'memory' or 'redis://host:port/db'")
    return True

"""The foreign engines' event feeds of one gateway: built per worker, supervised, with their status.

``EngineFeeds`` builds, for a worker, one translator and one ``FeedStatus`` per event source (a ZMQ
publisher per DP rank, or TensorRT-LLM's HTTP drain) and the coroutine that runs them. A source that fails
(a malformed endpoint, an unexpected error) is logged, resynced (its blocks cleared, as its state is lost)
and retried with backoff; it never takes the other feeds down. The caller (``KVService``) owns the tasks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.kvindex.feeds.discovery import EventSource
from gateway.kvindex.feeds.feed_status import DEFAULT_QUIET_AFTER_S, FeedStatus, WorkerFeeds
from gateway.kvindex.feeds.rechunk import EngineEventTranslator, TranslatorConfig
from gateway.kvindex.feeds.trtllm_http import PostJson, run_trtllm_drain
from gateway.kvindex.feeds.zmq_feed import ZmqSource, ZmqTiming, run_zmq_feed
from kvgate_core.kvcontract.events import EventType, KVEvent

logger = logging.getLogger(__name__)

#: Engines publishing the ZMQ wire format (TensorRT-LLM: its opt-in ZMQ publisher; else ``add_trtllm``).
ZMQ_ENGINES: Final = ("vllm", "sglang", "trtllm")
#: Engines whose requests select a LoRA adapter through ``model`` (the adapter name roots the chain).
_LORA_IN_MODEL: Final = frozenset({"vllm"})

Sink = Callable[[Sequence[KVEvent]], None]


@dataclass(frozen=True, slots=True)
class EngineFeedConfig:
    """Tuning of the engine feeds; only ``block_size`` (the gateway's) usually changes."""

    block_size: int = 16
    quiet_after_s: float = DEFAULT_QUIET_AFTER_S
    replay_timeout_s: float = 2.0
    tick_s: float = 1.0
    drain_interval_s: float = 0.5
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    max_mapped: int = 1_000_000


class EngineFeeds:
    """The engine feeds' translators and statuses, per worker.

    Args:
        config: tuning.
        clock: monotonic seconds (quiet detection).
        on_quiet: called with a worker id when its feed turns quiet (its blocks are no longer trusted).
        on_flowing: called with a worker id when its feed flows (again).
        activity: requests routed to a worker so far, by worker id (``FeedStatus``: an idle engine is not
            quiet); None: silence alone makes a feed quiet.
    """

    def __init__(
        self,
        config: EngineFeedConfig,
        *,
        clock: Callable[[], float],
        on_quiet: Callable[[str], None] | None = None,
        on_flowing: Callable[[str], None] | None = None,
        activity: Callable[[str], int] | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._activity = activity
        self._on_quiet, self._on_flowing = on_quiet, on_flowing
        self._workers: dict[str, WorkerFeeds] = {}

    def zmq(
        self, worker_id: str, sources: Sequence[EventSource], *, model: str, engine: str, sink: Sink
    ) -> Coroutine[Any, Any, None]:
        """The coroutine following ``sources`` (the worker's DP ranks) until cancelled; events go to ``sink``.

        Raises:
            ValueError: ``engine`` publishes no ZMQ events, or no source is given.
        """
        if engine not in ZMQ_ENGINES:
            raise ValueError(f"engine {engine!r} is not supported; use one of: {', '.join(ZMQ_ENGINES)}")
        if not sources:
            raise ValueError(f"worker {worker_id}: no KV event source given")
        feeds = self._new_worker(worker_id, engine)
        timing = ZmqTiming(self.config.replay_timeout_s, self.config.tick_s)
        runs = []
        for source in sources:
            translator = self._translator(worker_id, model, engine)
            status = feeds.add_source(
                source.endpoint, clock=self._clock, quiet_after_s=self.config.quiet_after_s,
                skipped=translator.skipped, activity=self._activity_of(worker_id),
            )  # fmt: skip
            zmq_source = ZmqSource(source.endpoint, source.replay_endpoint, source.topic)
            run = functools.partial(
                run_zmq_feed, zmq_source, translator=translator, sink=sink, status=status, timing=timing
            )
            runs.append(self._supervise(run, translator, status, sink))
        return _all(runs)

    def trtllm(
        self,
        worker_id: str,
        url: str,
        *,
        model: str,
        post: PostJson,
        sink: Sink,
        block_size: int | None = None,
    ) -> Coroutine[Any, Any, None]:
        """The coroutine polling TensorRT-LLM's HTTP drain of the worker at ``url`` until cancelled."""
        feeds = self._new_worker(worker_id, "trtllm")
        translator = self._translator(worker_id, model, "trtllm")
        status = feeds.add_source(
            url, clock=self._clock, quiet_after_s=self.config.quiet_after_s, skipped=translator.skipped,
            activity=self._activity_of(worker_id),
        )  # fmt: skip

        run = functools.partial(
            run_trtllm_drain, url, post=post, translator=translator, sink=sink, status=status,
            interval_s=self.config.drain_interval_s, block_size=block_size,
        )  # fmt: skip
        return self._supervise(run, translator, status, sink)

    def remove(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    def status(self, worker_id: str) -> dict[str, Any] | None:
        """The worker's feed status (``WorkerFeeds.as_dict``), or None when no engine feed follows it."""
        feeds = self._workers.get(worker_id)
        return None if feeds is None else feeds.as_dict()

    def trusted(self, worker_id: str) -> bool:
        """False while the worker's engine feed is quiet or stopped (True for workers without one)."""
        feeds = self._workers.get(worker_id)
        return feeds is None or feeds.trusted

    def _activity_of(self, worker_id: str) -> Callable[[], int] | None:
        activity = self._activity
        return None if activity is None else functools.partial(activity, worker_id)

    def _new_worker(self, worker_id: str, engine: str) -> WorkerFeeds:
        feeds = WorkerFeeds(worker_id, engine, on_quiet=self._on_quiet, on_flowing=self._on_flowing)
        self._workers[worker_id] = feeds
        return feeds

    def _translator(self, worker_id: str, model: str, engine: str) -> EngineEventTranslator:
        return EngineEventTranslator(
            TranslatorConfig(
                worker_id, model, self.config.block_size, self.config.max_mapped,
                lora_in_model=engine in _LORA_IN_MODEL,
            )
        )  # fmt: skip

    async def _supervise(
        self,
        run: Callable[[], Awaitable[None]],
        translator: EngineEventTranslator,
        status: FeedStatus,
        sink: Sink,
    ) -> None:
        delay = self.config.backoff_initial_s
        try:
            while True:
                try:
                    await run()
                    return
                except Exception as exc:  # noqa: BLE001 - one broken source must not stop the others
                    logger.warning(
                        "KV event source %s failed: %r; retrying in %.1f s", status.source, exc, delay
                    )
                status.num_resyncs += 1
                translator.reset()
                sink([KVEvent(worker=translator.config.worker, type=EventType.CLEARED)])
                status.tick()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.backoff_max_s)
        finally:
            status.stop()


async def _all(runs: Sequence[Coroutine[Any, Any, None]]) -> None:
    async with asyncio.TaskGroup() as group:
        for run in runs:
            group.create_task(run)

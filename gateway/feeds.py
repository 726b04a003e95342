"""Which KV-event feed follows each worker, decided from what its engine is.

The health loop detects each worker's engine (``gateway.engines.detect``) and hands the record here
(``EventFollower.on_detected``); the follower starts the feed that engine offers:

* kvgate workers: their own SSE ``/kv/events`` (``KVService.add_worker``);
* a ZMQ publisher named in the worker URL (``#events=tcp://…``): followed as the engine's format (vLLM,
  SGLang or TensorRT-LLM);
* vLLM: the publishers it lists at ``GET /kv_event_sources`` (wildcard hosts replaced by the worker's);
  SGLang: the publisher its ``GET /server_info`` names (``kv_events_config``);
* TensorRT-LLM: its HTTP drain ``POST /kv_cache_events`` (one gateway process may poll it);
* anything else (TGI, LMDeploy, MII, generic OpenAI servers): no feed; placement is learned from routing.

Feeds hash the engine's tokens under the model name the gateway hashes requests with: ``#model=`` when
given, else the engine's served model. A feed that goes quiet while requests went to its worker marks the
worker's facts (``events_trusted``); routing then ignores its indexed blocks until events flow again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from gateway.engines.detect import detect_engine
from gateway.engines.probe import Get
from gateway.engines.profiles import EngineKind
from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.fleet.signals import adopt_detection
from gateway.kvindex.feeds.discovery import EventSource, discover_event_sources, discover_sglang_sources
from gateway.kvindex.hybrid import IndexMode
from gateway.settings import WorkerSpec

logger = logging.getLogger(__name__)
_ZMQ_ENGINES = frozenset({EngineKind.VLLM, EngineKind.SGLANG, EngineKind.TRTLLM})
_DISCOVERY_TIMEOUT_S = 5.0


class FeedRunner(Protocol):
    """What the follower uses of the KV service (``gateway.kvindex.service.KVService``)."""

    @property
    def workers(self) -> Mapping[str, object]: ...

    @property
    def is_approximate(self) -> bool: ...

    def add_worker(self, worker_id: str, url: str) -> None: ...

    def add_engine_worker(
        self, worker_id: str, endpoint: str, *, model: str, engine: str = "vllm"
    ) -> None: ...

    def add_event_sources(
        self, worker_id: str, sources: Sequence[EventSource], *, model: str, engine: str = "vllm"
    ) -> None: ...

    def add_trtllm_worker(
        self, worker_id: str, url: str, model: str, *, block_size: int | None = None
    ) -> None: ...

    def set_mode(self, worker_id: str, mode: IndexMode) -> bool: ...

    def worker_mode(self, worker_id: str) -> IndexMode: ...

    @property
    def quiet_mode(self) -> IndexMode: ...

    def set_capacity(self, worker_id: str, tokens: int) -> None: ...


class EventFollower:
    """Starts each worker's KV-event feed once its engine is known.

    Args:
        kv: the KV service that runs the feeds.
        fleet: the registry (the quiet/flowing callbacks mark records).
        get: the health loop's GET, for ``/kv_event_sources``.
        specs: the configured workers by id (an explicit ``#events=``/``#model=`` wins over discovery).
    """

    def __init__(self, kv: FeedRunner, fleet: Fleet, get: Get, specs: Mapping[str, WorkerSpec]) -> None:
        self._kv = kv
        self._fleet = fleet
        self._get = get
        self._specs = dict(specs)
        self._tasks: set[asyncio.Task[None]] = set()

    def on_detected(self, record: WorkerRecord) -> None:
        """The health loop's hook: size the worker's assumed cache from its engine's KV capacity, and follow
        its events (idempotent: a followed worker is skipped)."""
        capacity = record.facts.kv_capacity_tokens
        if capacity:
            self._kv.set_capacity(record.id, capacity)
        record.facts.index_mode = self._kv.worker_mode(record.id)
        if record.id in self._kv.workers or self._kv.is_approximate:
            return  # followed already, or the index learns placement from routing alone
        task = asyncio.get_running_loop().create_task(self.follow(record), name=f"kv-follow-{record.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_added(self, record: WorkerRecord, spec: WorkerSpec) -> None:
        """A worker registered at run time (``POST /admin/workers``): remember its spec; its feed starts
        once the health loop has detected its engine."""
        self._specs[record.id] = spec

    async def follow(self, record: WorkerRecord) -> None:
        """Start the feed ``record``'s engine offers; log where there is none."""
        facts, spec = record.facts, self._specs.get(record.id)
        model = (spec.model if spec is not None else None) or facts.served_model or _first(record.models)
        explicit = spec.events if spec is not None else None
        try:
            if facts.kind is EngineKind.KVGATE and explicit is None:
                self._kv.add_worker(record.id, record.url)
                self._precise(record)
            elif model is None:
                logger.warning(
                    "worker %s serves no model the gateway knows yet: no KV events followed", record.id
                )
            elif explicit is not None:
                engine = facts.kind if facts.kind in _ZMQ_ENGINES else EngineKind.VLLM
                self._kv.add_engine_worker(record.id, explicit, model=model, engine=str(engine))
                self._precise(record)
            elif facts.kind in (EngineKind.VLLM, EngineKind.SGLANG):
                await self._follow_discovered(record, model)
            elif facts.kind is EngineKind.TRTLLM:
                self._kv.add_trtllm_worker(record.id, record.url, model, block_size=facts.block_size)
                self._precise(record)
            else:
                logger.info(
                    "worker %s (%s) publishes no KV events the gateway can read: its placement is learned "
                    "from routing", record.id, facts.kind,
                )  # fmt: skip
        except ValueError as exc:
            logger.warning("worker %s: KV events not followed: %s", record.id, exc)

    async def _follow_discovered(self, record: WorkerRecord, model: str) -> None:
        """vLLM lists its publishers at ``/kv_event_sources``; SGLang names its one in ``/server_info``."""
        kind = record.facts.kind
        discover = discover_event_sources if kind is EngineKind.VLLM else discover_sglang_sources
        try:
            async with asyncio.timeout(_DISCOVERY_TIMEOUT_S):
                sources = await discover(self._get, record.url)
        except (OSError, TimeoutError) as exc:
            logger.warning(
                "worker %s: KV event discovery failed (%r); retried at its next detection", record.id, exc
            )
            return
        if not sources:
            logger.warning(
                "worker %s (%s) publishes no KV events: start it with --kv-events-config "
                "'{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
                "\"endpoint\": \"tcp://*:5557\"}' (a wildcard host: given a host, vLLM connects instead "
                "of binding) for precise routing",
                record.id, kind,
            )  # fmt: skip
            return
        record.facts.event_endpoints = tuple(s.endpoint for s in sources)
        self._kv.add_event_sources(record.id, sources, model=model, engine=str(kind))
        self._precise(record)

    def _precise(self, record: WorkerRecord) -> None:
        """A feed follows the worker now: its prefix hits come from its events."""
        self._kv.set_mode(record.id, "precise")
        record.facts.index_mode = self._kv.worker_mode(record.id)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def detect_fleet(fleet: Fleet, get: Get, *, timeout_s: float = 10.0) -> None:
    """Detect every worker's engine once, concurrently, before the parity gate picks each one's probe route
    (a worker that does not answer in ``timeout_s`` stays ``auto``; the health loop detects it later)."""

    async def one(record: WorkerRecord) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                adopt_detection(
                    record, await detect_engine(get, record.url, configured=record.configured_engine)
                )
        except TimeoutError:
            logger.info("worker %s did not answer detection at start-up", record.id)

    await asyncio.gather(*(one(r) for r in fleet))


class FeedHooks:
    """The KV service's callbacks about feeds, answered from the registry (and, once ``attach``-ed, the
    service: a quiet feed's worker turns approximate, or gets no hits under ``--kv-index precise``)."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._kv: FeedRunner | None = None

    def attach(self, kv: FeedRunner) -> None:
        self._kv = kv

    def on_quiet(self, worker_id: str) -> None:
        """The KV service's callback: the worker's feed went quiet; stop trusting its blocks."""
        if (record := self._fleet.get(worker_id)) is not None:
            record.facts.events_trusted = False
            self._switch(record, "quiet")

    def on_flowing(self, worker_id: str) -> None:
        """The KV service's callback: events flow (again)."""
        if (record := self._fleet.get(worker_id)) is not None:
            record.facts.events_trusted = True
            self._switch(record, "flowing")

    def _switch(self, record: WorkerRecord, state: str) -> None:
        kv = self._kv
        if kv is None:
            return
        kv.set_mode(record.id, kv.quiet_mode if state == "quiet" else "precise")
        record.facts.index_mode = kv.worker_mode(record.id)

    def activity(self, worker_id: str) -> int:
        """Requests routed to the worker so far (a quiet feed is one that stays silent after some)."""
        record = self._fleet.get(worker_id)
        return record.routed_total if record is not None else 0


def _first(models: frozenset[str]) -> str | None:
    return min(models) if models else None

"""The fleet registry: which workers exist, their role, health, models and last reported load.
Compiled with mypyc (``docs/development.md``: what that rules out).

Static workers come from ``--worker``; more are registered at run time through ``/admin/workers``.
Draining a worker stops new requests to it; it is removed once its in-flight requests finish (the health
loop checks). Health probing lives in ``fleet.health``; in-flight accounting in the ``LoadBoard``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gateway.engines.affinity import update_affinity
from gateway.engines.profiles import EngineFacts, EngineKind
from gateway.errors import Conflict, NotFound
from gateway.fleet.breaker import CircuitBreaker
from gateway.settings import BreakerSettings, WorkerSpec
from policies.api import Role

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerRecord:
    """One worker as the gateway knows it; mutated only by the registry, the health loop and the proxy."""

    id: str
    url: str
    role: Role
    breaker: CircuitBreaker
    healthy: bool = False
    draining: bool = False
    models: frozenset[str] = frozenset()
    model_cards: tuple[dict[str, object], ...] = ()
    running: int = 0
    queue_depth: int = 0
    kv_usage: float = 0.0
    cached_blocks: int = 0
    # the worker's running slots as its /load advertises them (``max_running``); 0: not advertised
    max_running: int = 0
    # requests this gateway saw finish on the worker since its last /load probe (reset by the probe)
    finished_since_probe: int = 0
    # requests routed to the worker so far (its KV-event feed is quiet only if requests went there unseen)
    routed_total: int = 0
    # what the gateway knows of the engine behind the URL (``gateway.engines``): kind, signals, cache facts
    facts: EngineFacts = field(default_factory=EngineFacts)
    # the engine as configured (``engine=``); ``auto``: ``facts.kind`` is detected
    configured_engine: EngineKind = EngineKind.AUTO
    # the operator's word on the engine (``kv_tokens=``, ``prefix_cache=``): kept over what detection finds
    operator_kv_tokens: int | None = None
    operator_prefix_cache: bool | None = None

    @property
    def waiting_now(self) -> int:
        """The probe's queue depth less one per request seen finishing since: each completion frees a slot,
        so a probe taken while this gateway's own request waited does not count it after it is gone."""
        return max(0, self.queue_depth - self.finished_since_probe)

    @property
    def available(self) -> bool:
        """Healthy, not draining, and its breaker lets traffic through."""
        return self.healthy and not self.draining and self.breaker.allows()


class Fleet:
    """The registry of workers, keyed by id, in registration order."""

    __slots__ = ("_breaker", "_clock", "_records")

    def __init__(self, *, breaker: BreakerSettings, clock: Callable[[], float]) -> None:
        self._breaker = breaker
        self._clock = clock
        self._records: dict[str, WorkerRecord] = {}

    def __iter__(self) -> Iterator[WorkerRecord]:
        return iter(tuple(self._records.values()))

    def __len__(self) -> int:
        return len(self._records)

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._records.get(worker_id)

    def add(self, spec: WorkerSpec) -> WorkerRecord:
        """Register a worker; it gets traffic once its first health probe passes.

        Raises:
            Conflict: a worker with this id is registered already.
        """
        if spec.id in self._records:
            raise Conflict(f"worker {spec.id!r} is already registered; drain it first", param="id")
        breaker = CircuitBreaker(
            failures=self._breaker.failures, open_s=self._breaker.open_s, clock=self._clock
        )
        engine = EngineKind(spec.engine)
        facts = EngineFacts(kind=engine, detected_by="configured" if engine is not EngineKind.AUTO else "")
        if spec.prefix_cache is not None:
            facts.prefix_reuse = spec.prefix_cache
        if spec.kv_tokens is not None:
            facts.kv_capacity_tokens = spec.kv_tokens
        update_affinity(facts)
        record = WorkerRecord(
            id=spec.id, url=spec.url, role=spec.role, breaker=breaker, facts=facts, configured_engine=engine,
            operator_kv_tokens=spec.kv_tokens, operator_prefix_cache=spec.prefix_cache,
        )  # fmt: skip
        self._records[spec.id] = record
        logger.info("worker added", extra={"worker": spec.id, "url": spec.url, "role": str(spec.role)})
        return record

    def drain(self, worker_id: str) -> WorkerRecord:
        """Stop sending new requests to a worker; it is removed when its in-flight requests finish.

        Raises:
            NotFound: no worker has this id.
        """
        record = self._records.get(worker_id)
        if record is None:
            raise NotFound(f"no worker with id {worker_id!r}; GET /admin/workers lists them", param="id")
        record.draining = True
        logger.info("worker draining", extra={"worker": worker_id})
        return record

    def undrain(self, worker_id: str) -> WorkerRecord:
        """Cancel a drain: the worker takes new requests again (at once if healthy). No-op when not draining.

        Raises:
            NotFound: no worker has this id (a drained worker is removed once idle: register it again).
        """
        record = self._records.get(worker_id)
        if record is None:
            raise NotFound(
                f"no worker with id {worker_id!r}; a drained worker is removed once idle: register it again "
                "with POST /admin/workers",
                param="id",
            )
        if record.draining:
            record.draining = False
            logger.info("worker drain cancelled", extra={"worker": worker_id})
        return record

    def remove(self, worker_id: str) -> None:
        self._records.pop(worker_id, None)
        logger.info("worker removed", extra={"worker": worker_id})

    def serving(self, model: str | None) -> list[WorkerRecord]:
        """Workers that list ``model`` (all of them when ``model`` is None), draining ones excluded."""
        return [r for r in self._records.values() if not r.draining and (model is None or model in r.models)]

    def knows_model(self, model: str) -> bool:
        return any(model in r.models for r in self._records.values())

    def model_cards(self) -> list[dict[str, object]]:
        """The union of the workers' ``/v1/models`` entries, first seen wins, in registration order."""
        seen: dict[str, dict[str, object]] = {}
        for record in self._records.values():
            for card in record.model_cards:
                seen.setdefault(str(card.get("id")), card)
        return list(seen.values())

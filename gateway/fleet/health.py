"""Active health checks: each round probes every worker's ``/health`` and reads its engine's load signal
(and ``/v1/models`` when the worker turns healthy and every ``models_interval_s``: model lists rarely change).

When a worker turns healthy its engine is detected (``gateway.engines.detect``): which engine answers, its
version, block size and KV capacity, and so which load signal, health rule and parity probe apply. A worker
whose engine could not be told (``auto`` after a detection that got no answer) is asked again every
``models_interval_s``. Each detection is logged on one INFO line and handed to ``on_detected`` (the KV
service starts that worker's event feed there). One probe asks each path at most once (``OnceGet``), so
detection and the first load scrape share ``/v1/models`` and vLLM's ``/metrics``.

The load scrape runs beside the probe, not in it: under its own deadline (the engine profile's
``load_timeout_s`` where the engine answers slowly by design, as TensorRT-LLM's JSON ``/metrics`` does, else
the probe's), at most one at a time per worker (TensorRT-LLM's drains a queue), and a scrape that fails or
runs late leaves the gateway's in-flight count standing in for that worker's load without touching its
health. The background loop does not wait for scrapes, so a slow one never delays the next round.

A probe failure marks the worker unhealthy (it gets no traffic until a probe passes). Passive failures seen
by the proxy feed the worker's circuit breaker instead (``fleet.breaker``); on an engine whose ``/health`` is
a static 200 (DeepSpeed-MII: ``health_trusted`` false) that breaker is the only real signal. The round also
finishes drains: a draining worker with no request in flight is removed. The background loop spreads a
round's probes over its interval instead of sending them all at once, so a large fleet's probes never stall
the event loop (and the requests on it) in one burst.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import orjson

from gateway.engines.detect import detect_engine
from gateway.engines.load import kvgate_load
from gateway.engines.probe import Get, OnceGet
from gateway.engines.profiles import EngineFacts, EngineKind
from gateway.engines.summary import describe
from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.fleet.signals import adopt_detection, apply_engine_load, scrape_load
from gateway.state.protocols import LoadBoard

__all__ = ["Detect", "Get", "HealthChecker", "apply_load", "apply_models"]

logger = logging.getLogger(__name__)


class Detect(Protocol):
    """``await detect(get, base_url, configured=kind)`` -> the engine's facts (``detect_engine``)."""

    async def __call__(self, get: Get, base_url: str, *, configured: EngineKind) -> EngineFacts: ...


def apply_load(record: WorkerRecord, data: Mapping[str, Any]) -> None:
    """Copy a kvgate worker's ``/load`` figures onto its record (unknown keys ignored, missing ones 0).

    ``max_running`` (its running slots) sizes the worker's upstream connection cap (``gateway.proxy``).
    """
    apply_engine_load(record, kvgate_load(data))


def apply_models(record: WorkerRecord, data: Mapping[str, Any]) -> None:
    """Copy a worker's ``/v1/models`` list onto its record."""
    cards = tuple(c for c in data.get("data", ()) if isinstance(c, dict) and isinstance(c.get("id"), str))
    record.model_cards = cards
    record.models = frozenset(str(c["id"]) for c in cards)


class HealthChecker:
    """Probes the fleet every ``interval_s`` and completes drains.

    Args:
        fleet: the registry to update.
        get: the probes' HTTP GET (``kvgate_core.h1.H1Getter`` on its own pool).
        load: in-flight accounting, to know when a draining worker is idle.
        interval_s: time between rounds; each probe's deadline is the same.
        on_removed: called with a worker id after a drained worker is removed.
        models_interval_s: how often a healthy worker's ``/v1/models`` is read again (and an undetected
            engine detected again).
        on_detected: called with the record after each detection that told the engine (its ``facts`` are
            filled): the place to start per-engine work such as a KV-event feed. It must not block.
        detect: the engine detection (``gateway.engines.detect.detect_engine``; a fake in tests).
        read_load: read each engine's load signal (``--engine-load on``); off, the in-flight count stands in.
        clock: monotonic clock, injected for tests.
    """

    def __init__(
        self,
        fleet: Fleet,
        get: Get,
        load: LoadBoard,
        *,
        interval_s: float,
        on_removed: Callable[[str], None] = lambda _id: None,
        models_interval_s: float = 30.0,
        on_detected: Callable[[WorkerRecord], None] = lambda _record: None,
        detect: Detect = detect_engine,
        read_load: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._get = get
        self._load = load
        self._interval_s = interval_s
        self._on_removed = on_removed
        self._probe_timeout_s = min(max(interval_s, 1.0), 5.0)
        self._models_interval_s = models_interval_s
        self._on_detected = on_detected
        self._detect = detect
        self._read_load = read_load
        self._clock = clock
        self._models_read_at: dict[str, float] = {}
        self._detected_at: dict[str, float] = {}
        self._scrapes: dict[str, asyncio.Task[None]] = {}  # per worker: its load scrape under way

    async def run(self) -> None:
        """Probe until cancelled: every worker once per interval, unhealthy ones every second; a round's
        probes start evenly spread over its tick."""
        tick_s = min(self._interval_s, 1.0)
        since_full_s = 0.0
        try:
            while True:
                since_full_s += tick_s
                full = since_full_s >= self._interval_s
                if full:
                    since_full_s = 0.0
                try:
                    await self.round(full=full, spread_s=tick_s, wait_load=False)
                except Exception:  # a background loop survives anything; the next round retries
                    logger.exception("health round failed")
                    await asyncio.sleep(tick_s)
        finally:
            for task in self._scrapes.values():
                task.cancel()

    async def round(self, *, full: bool = True, spread_s: float = 0.0, wait_load: bool = True) -> None:
        """Probe workers (only unhealthy ones unless ``full``), starting them ``spread_s`` / n apart (all at
        once by default; the round lasts at least ``spread_s``), then finish idle drains; ``wait_load``:
        also wait for the load scrapes the round started (the background loop does not)."""
        records = list(self._fleet)
        due = [r for r in records if not r.draining and (full or not r.healthy)]
        gap = spread_s / max(1, len(due))
        tasks: list[asyncio.Task[None]] = []
        try:
            for record in due:
                tasks.append(asyncio.create_task(self.probe(record)))
                if gap > 0:
                    await asyncio.sleep(gap)
            if not due and spread_s > 0:
                await asyncio.sleep(spread_s)
            await asyncio.gather(*tasks)
            if wait_load:
                await self.settle()
        finally:
            for task in tasks:
                task.cancel()
        for record in records:
            if record.draining and self._load.get(record.id).inflight_requests == 0:
                self._fleet.remove(record.id)
                self._models_read_at.pop(record.id, None)
                self._detected_at.pop(record.id, None)
                self._on_removed(record.id)
        for gone in self._scrapes.keys() - {r.id for r in self._fleet}:  # removed by drain or by the admin
            self._scrapes.pop(gone).cancel()

    async def settle(self) -> None:
        """Until every load scrape under way has ended (each is bounded by its deadline)."""
        pending = [t for t in self._scrapes.values() if not t.done()]
        if pending:
            await asyncio.wait(pending)

    async def probe(self, record: WorkerRecord) -> None:
        """Probe one worker: healthy when ``/health`` answers 200; then its engine is detected if due, and
        a read of its load signal started (``settle`` waits for it)."""
        was_healthy = record.healthy
        get = OnceGet(self._get)
        try:
            async with asyncio.timeout(self._probe_timeout_s):
                status, _ = await get(record.url, "/health")
                record.healthy = status == 200
            if record.healthy:
                if self._detection_due(record, turned_healthy=not was_healthy):
                    await self._detect_engine(record, get)
                async with asyncio.timeout(self._probe_timeout_s):
                    await self._poll_extras(record, get, models=not was_healthy)
        except (TimeoutError, OSError, ValueError) as exc:
            record.healthy = False
            if was_healthy:
                logger.warning("worker unhealthy", extra={"worker": record.id, "error": repr(exc)})
            return
        if record.healthy != was_healthy:
            logger.info("worker health changed", extra={"worker": record.id, "healthy": record.healthy})

    def _detection_due(self, record: WorkerRecord, *, turned_healthy: bool) -> bool:
        """On turning healthy (it may have restarted as something else), and every ``models_interval_s``
        while the engine is still unknown."""
        if turned_healthy:
            return True
        if record.facts.kind is not EngineKind.AUTO:
            return False
        last = self._detected_at.get(record.id)
        return last is None or self._clock() - last >= self._models_interval_s

    async def _detect_engine(self, record: WorkerRecord, get: Get) -> None:
        """Detect the worker's engine, under its own deadline: a slow answer leaves it healthy, undetected."""
        self._detected_at[record.id] = self._clock()
        try:
            async with asyncio.timeout(self._probe_timeout_s):
                detected = await self._detect(get, record.url, configured=record.configured_engine)
        except TimeoutError:
            detected = EngineFacts(detected_by="detection timed out")
        if detected.kind is EngineKind.AUTO:
            why = detected.detected_by or "no answer"
            logger.warning(
                "worker %s: engine not detected (%s); asked again in %.0f s", record.id, why,
                self._models_interval_s, extra={"worker": record.id},
            )  # fmt: skip
            if record.facts.kind is not EngineKind.AUTO:
                return  # known before: keep what was known
        adopt_detection(record, detected)
        if detected.kind is EngineKind.AUTO:
            return
        logger.info(
            "%s", describe(record.id, record.facts), extra={"worker": record.id, "engine": str(detected.kind)}
        )
        try:
            self._on_detected(record)
        except Exception:  # a hook's bug must not stop health checks
            logger.exception("on_detected hook failed", extra={"worker": record.id})

    async def _poll_extras(self, record: WorkerRecord, get: Get, *, models: bool) -> None:
        """The load signal every time; ``/v1/models`` when ``models`` (the worker just turned healthy), while
        its list is unknown, or ``models_interval_s`` after the last read."""
        now = self._clock()
        last = self._models_read_at.get(record.id)
        if models or not record.models or last is None or now - last >= self._models_interval_s:
            status, body = await get(record.url, "/v1/models")
            if status == 200 and isinstance(data := orjson.loads(body), dict):
                apply_models(record, data)
                self._models_read_at[record.id] = now
        running = self._scrapes.get(record.id)
        if running is None or running.done():  # never two at once: TensorRT-LLM's /metrics drains on read
            self._scrapes[record.id] = asyncio.create_task(self._scrape(record, get))

    async def _scrape(self, record: WorkerRecord, get: Get) -> None:
        """One load read under its own deadline; a failure leaves the in-flight count standing in, and the
        worker's health as the probe found it."""
        facts = record.facts
        deadline = max(facts.profile.load_timeout_s or 0.0, self._probe_timeout_s)
        try:
            async with asyncio.timeout(deadline):
                await scrape_load(record, get, enabled=self._read_load, clock=self._clock)
        except Exception as exc:  # a background read survives anything; the next round reads again
            if not isinstance(exc, TimeoutError | OSError | ValueError):
                logger.exception("load scrape failed", extra={"worker": record.id})
            path = facts.load_path or facts.profile.load_path
            why = f"no answer within {deadline:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            facts.load_signal = "in-flight"
            facts.load_note = f"GET {path}: {why}; in-flight count stands in (last figures kept)"

"""Active health checks: each round probes every worker's ``/health`` and ``/load`` (and ``/v1/models`` when
the worker turns healthy and every ``models_interval_s``: model lists rarely change).

A probe failure marks the worker unhealthy (it gets no traffic until a probe passes). Passive failures seen
by the proxy feed the worker's circuit breaker instead (``fleet.breaker``). The round also finishes drains:
a draining worker with no request in flight is removed. The background loop spreads a round's probes over
its interval instead of sending them all at once, so a large fleet's probes never stall the event loop
(and the requests on it) in one burst.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.state.protocols import LoadBoard

logger = logging.getLogger(__name__)

#: ``await get(base_url, path)`` -> (status, body); raises ``OSError`` or ``TimeoutError`` when it fails
Get = Callable[[str, str], Awaitable[tuple[int, bytes]]]


def _int(data: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return 0


def apply_load(record: WorkerRecord, data: Mapping[str, Any]) -> None:
    """Copy a worker's ``/load`` figures onto its record (unknown keys ignored, missing ones 0).

    ``max_running`` (its running slots) sizes the worker's upstream connection cap (``gateway.proxy``).
    """
    record.running = _int(data, "running", "num_running")
    record.max_running = _int(data, "max_running", "max_num_seqs")
    record.queue_depth = _int(data, "waiting", "num_waiting", "queue_depth")
    record.finished_since_probe = 0
    record.cached_blocks = _int(data, "cached_blocks", "num_cached_blocks", "kv_blocks_cached")
    usage = data.get("kv_usage", 0.0)
    record.kv_usage = min(1.0, max(0.0, float(usage))) if isinstance(usage, int | float) else 0.0


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
        models_interval_s: how often a healthy worker's ``/v1/models`` is read again.
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._get = get
        self._load = load
        self._interval_s = interval_s
        self._on_removed = on_removed
        self._probe_timeout_s = min(max(interval_s, 1.0), 5.0)
        self._models_interval_s = models_interval_s
        self._clock = clock
        self._models_read_at: dict[str, float] = {}

    async def run(self) -> None:
        """Probe until cancelled: every worker once per interval, unhealthy ones every second; a round's
        probes start evenly spread over its tick."""
        tick_s = min(self._interval_s, 1.0)
        since_full_s = 0.0
        while True:
            since_full_s += tick_s
            full = since_full_s >= self._interval_s
            if full:
                since_full_s = 0.0
            try:
                await self.round(full=full, spread_s=tick_s)
            except Exception:  # a background loop survives anything; the next round retries
                logger.exception("health round failed")
                await asyncio.sleep(tick_s)

    async def round(self, *, full: bool = True, spread_s: float = 0.0) -> None:
        """Probe workers (only unhealthy ones unless ``full``), starting them ``spread_s`` / n apart (all at
        once by default; the round lasts at least ``spread_s``), then finish idle drains."""
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
        finally:
            for task in tasks:
                task.cancel()
        for record in records:
            if record.draining and self._load.get(record.id).inflight_requests == 0:
                self._fleet.remove(record.id)
                self._models_read_at.pop(record.id, None)
                self._on_removed(record.id)

    async def probe(self, record: WorkerRecord) -> None:
        """Probe one worker; mark it healthy when ``/health`` answers 200."""
        was_healthy = record.healthy
        try:
            async with asyncio.timeout(self._probe_timeout_s):
                status, _ = await self._get(record.url, "/health")
                record.healthy = status == 200
                if record.healthy:
                    await self._poll_extras(record, models=not was_healthy)
        except (TimeoutError, OSError, ValueError) as exc:
            record.healthy = False
            if was_healthy:
                logger.warning("worker unhealthy", extra={"worker": record.id, "error": repr(exc)})
            return
        if record.healthy != was_healthy:
            logger.info("worker health changed", extra={"worker": record.id, "healthy": record.healthy})

    async def _poll_extras(self, record: WorkerRecord, *, models: bool) -> None:
        """``/load`` every time; ``/v1/models`` when ``models`` (the worker just turned healthy), while its
        list is unknown, or ``models_interval_s`` after the last read."""
        now = self._clock()
        last = self._models_read_at.get(record.id)
        if models or not record.models or last is None or now - last >= self._models_interval_s:
            status, body = await self._get(record.url, "/v1/models")
            if status == 200 and isinstance(data := orjson.loads(body), dict):
                apply_models(record, data)
                self._models_read_at[record.id] = now
        status, body = await self._get(record.url, "/load")
        if status == 200 and isinstance(figures := orjson.loads(body), dict):
            apply_load(record, figures)

"""Configuration reload without dropping requests (SIGHUP).

The gateway re-reads its sources (flags, ``KVGATE_*``, the ``--config`` file) and brings the fleet to the
new worker list: new workers are registered (traffic once their health probe passes), workers no longer
listed are drained (in-flight requests finish, then they are removed), a draining worker listed again is
taken back. Requests in flight are never touched. Other settings (policy, state, ports) need a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.deps import Deps
from gateway.errors import ConfigError
from gateway.settings import WorkerSpec

logger = logging.getLogger(__name__)

WorkerSource = Callable[[], Sequence[WorkerSpec]]


@dataclass(frozen=True, slots=True)
class ReloadResult:
    added: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()


async def apply_workers(deps: Deps, specs: Sequence[WorkerSpec], wait_s: float = 30.0) -> ReloadResult:
    """Make the fleet match ``specs`` (by worker id).

    Workers that leave are drained only once one of the listed workers is available (or after ``wait_s``),
    so swapping a fleet never leaves a gap with no worker to serve.
    """
    wanted = {s.id: s for s in specs}
    current = {r.id: r for r in deps.fleet}
    added, drained, restored = [], [], []
    for wid, spec in wanted.items():
        record = current.get(wid)
        if record is None:
            record = deps.fleet.add(spec)
            deps.on_worker_added(record, spec)
            await deps.health.probe(record)
            added.append(wid)
        elif record.draining:
            record.draining = False
            restored.append(wid)
    await _wait_for_one_available(deps, list(wanted), wait_s)
    for wid, record in current.items():
        if wid not in wanted and not record.draining:
            deps.fleet.drain(wid)
            drained.append(wid)
    result = ReloadResult(tuple(added), tuple(drained), tuple(restored))
    logger.warning("configuration reloaded: added %s, drained %s, restored %s", added, drained, restored)
    return result


async def _wait_for_one_available(deps: Deps, worker_ids: Sequence[str], wait_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + wait_s
    while asyncio.get_running_loop().time() < deadline:
        records = [r for r in (deps.fleet.get(w) for w in worker_ids) if r is not None]
        if any(r.available and r.models for r in records):
            return
        for record in records:
            await deps.health.probe(record)
        await asyncio.sleep(0.2)
    logger.warning("no listed worker became available within %.0f s; draining the old ones anyway", wait_s)


async def reload(deps: Deps, source: WorkerSource) -> ReloadResult | None:
    """Re-read the worker list and apply it; a bad configuration is logged and changes nothing."""
    try:
        specs = source()
    except (ConfigError, ValueError, OSError) as exc:
        logger.error("configuration reload failed, nothing changed: %s", exc)
        return None
    if not specs:
        logger.error("configuration reload gave no worker; nothing changed")
        return None
    return await apply_workers(deps, specs)

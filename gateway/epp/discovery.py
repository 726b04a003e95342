"""Keeps the fleet equal to what an endpoint source lists (the endpoints file, an ``InferencePool``).

A source is polled; a change is applied with the gateway's reload (``gateway.reload.apply_workers``): new
endpoints join once their health probe passes, endpoints no longer listed are drained. A source that fails
to read (API down, file half-written) is logged and the fleet kept as it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from gateway.deps import Deps
from gateway.errors import ConfigError
from gateway.reload import apply_workers
from gateway.settings import WorkerSpec

logger = logging.getLogger(__name__)


class EndpointSource(Protocol):
    """Where endpoints come from; ``read`` returns None when nothing changed since the last read."""

    @property
    def name(self) -> str: ...

    async def read(self) -> Sequence[WorkerSpec] | None: ...


async def follow(
    deps: Deps, source: EndpointSource, interval_s: float, fixed: Sequence[WorkerSpec] = ()
) -> None:
    """Apply what ``source`` lists (and the ``fixed`` flags) every ``interval_s`` until cancelled."""
    last: tuple[str, ...] | None = None
    while True:
        try:
            specs = await source.read()
        except ConfigError as exc:
            logger.warning("%s: %s; the endpoints are kept as they are", source.name, exc.message)
            specs = None
        if specs is not None:
            wanted = {s.id: s for s in (*fixed, *specs)}
            key = tuple(sorted(wanted))
            if key != last and wanted:
                await apply_workers(deps, list(wanted.values()), wait_s=5.0)
                last = key
            elif not wanted:
                logger.warning("%s lists no endpoint; the endpoints are kept as they are", source.name)
        await asyncio.sleep(interval_s)

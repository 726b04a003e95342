"""The worker that stored a Responses API response: found in the record, or asked for.

``ResponseAffinity.owner(id)`` answers from ``ResponseOwners`` (memory, or Redis across replicas). An id the
record does not hold (stored before this gateway started, expired from the record, or created by a client
that called a worker directly) is looked for on the fleet: ``GET /v1/responses/{id}`` on each candidate at
once, within ``probe_timeout_s``; the first worker that has it is recorded and used. Then:

- the owner is no longer in the fleet, or nobody has the id → ``ResponseNotFound`` (404), the engines' own
  answer to an unknown id: the request is never answered silently without its history;
- the owner is in the fleet but unhealthy → ``NoHealthyWorker`` (503, retry later); it is never sent
  elsewhere, which would lose the history.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final
from urllib.parse import quote

from gateway.errors import ResponseNotFound
from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.state.response_owners import ResponseOwners

logger = logging.getLogger(__name__)

#: ``await get(base_url, path) -> (status, body)``; raises ``OSError`` when the exchange fails
Getter = Callable[[str, str], Awaitable[tuple[int, bytes]]]
_MAX_PROBES: Final = 64


def response_path(response_id: str) -> str:
    """``/v1/responses/{id}`` with the id percent-encoded."""
    return "/v1/responses/" + quote(response_id, safe="")


class ResponseAffinity:
    """Resolves response ids to the workers that stored them (see the module docstring).

    Args:
        owners: the record of ``response id → worker``.
        fleet: the workers.
        get: GETs a path on a worker (the health prober's keep-alive pool).
        probe_timeout_s: how long the fleet is asked for an id the record does not hold.
    """

    def __init__(
        self, owners: ResponseOwners, fleet: Fleet, get: Getter, probe_timeout_s: float = 2.0
    ) -> None:
        self._owners = owners
        self._fleet = fleet
        self._get = get
        self._probe_timeout_s = probe_timeout_s

    async def record(self, response_id: str, worker: str) -> None:
        await self._owners.record(response_id, worker)

    async def forget(self, response_id: str) -> None:
        await self._owners.forget(response_id)

    async def owner(
        self, response_id: str, model: str | None = None, *, param: str | None = None
    ) -> WorkerRecord:
        """The worker holding ``response_id`` (``model``: only its workers are asked when probing).

        Raises:
            ResponseNotFound: no worker holds it, or the one that did has left the fleet.
        """
        worker = await self._owners.owner(response_id)
        if worker is None:
            worker = await self._probe(response_id, model)
            if worker is not None:
                await self._owners.record(response_id, worker)
        record = self._fleet.get(worker) if worker is not None else None
        if record is None:
            what = "Previous response" if param == "previous_response_id" else "Response"
            raise ResponseNotFound(f"{what} with id '{response_id}' not found.", param=param)
        return record

    async def _probe(self, response_id: str, model: str | None) -> str | None:
        candidates = [r for r in self._fleet if r.healthy and (not model or model in r.models)][:_MAX_PROBES]
        if not candidates:
            return None
        path = response_path(response_id)
        tasks = {asyncio.create_task(self._has(r, path)): r.id for r in candidates}
        try:
            for done in asyncio.as_completed(tasks, timeout=self._probe_timeout_s):
                try:
                    found = await done
                except TimeoutError:
                    break
                if found is not None:
                    logger.info("response %s found on worker %s by asking the fleet", response_id, found)
                    return found
        finally:
            for task in tasks:
                task.cancel()
        return None

    async def _has(self, record: WorkerRecord, path: str) -> str | None:
        try:
            status, _ = await self._get(record.url, path)
        except OSError:
            return None
        return record.id if status == 200 else None

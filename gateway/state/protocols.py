"""State protocols shared by gateway replicas: load accounting per worker.

``memory`` implementations are the default and the unit-test doubles; Redis implementations share the
figures between replicas. All methods are synchronous on a local copy: a Redis-backed board pushes and pulls
in a background task, so the request path never waits on Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.state.load import WorkerLoad
from policies.placement import Placement

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["LoadBoard", "State", "WorkerLoad"]


class LoadBoard(Protocol):
    """In-flight requests and tokens per worker.

    Contract: every ``acquire`` is paired with exactly one ``release`` of the same figures (callers use
    ``try/finally``); counters never go below zero. ``add_routed`` is never undone.
    """

    def acquire(self, worker: str, tokens: int) -> None: ...

    def add_routed(
        self, worker: str, tokens: int, cached_tokens: int = 0, placement: Placement = Placement.OTHER
    ) -> None:
        """Count a request routed to ``worker``: ``tokens`` (prompt + completion budget), ``cached_tokens``
        of its prompt predicted cached there, ``placement`` what it did to the worker's sticky traffic."""
        ...

    def release(self, worker: str, tokens: int) -> None: ...

    def get(self, worker: str) -> WorkerLoad: ...

    def loads(self, workers: Sequence[str]) -> list[WorkerLoad]:
        """``get`` of each of ``workers``, in order, all at one instant (the routing snapshot: one clock
        reading and one decay factor for the fleet, not one per worker)."""
        ...

    def snapshot(self) -> Mapping[str, WorkerLoad]: ...

    def replicas(self) -> int:
        """Gateway replicas whose figures this board sums, itself included (1 in memory, or while the
        shared state is unreachable)."""
        ...

    def rank(self) -> int:
        """This replica's position among them, in ``[0, replicas())``: each live replica holds a different
        one (the same order on every replica, up to the sync interval); 0 alone."""
        ...


@dataclass(frozen=True, slots=True)
class State:
    """The state backends of one gateway, opened and closed together by ``open_state``.

    ``redis`` is the gateway's one Redis client (``gateway.state.redis_client``) with ``redis://`` state,
    else None; the KV backplane and the rate-limit buckets share it, and ``open_state`` closes it.
    """

    load: LoadBoard
    url: str = "memory"
    redis: Redis | None = None

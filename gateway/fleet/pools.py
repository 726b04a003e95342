"""Role pools: move ``both``-capable workers between the prefill and decode pools as load shifts.

Under PD disaggregation a fleet has two pools: prefill workers (role ``prefill``) and decode workers (role
``decode``). Workers registered as ``both`` can serve in either; this module assigns each of them to one
pool and moves them when one side saturates. The policy sees a worker's *pool* role (``WorkerRecord.role``
is set to it), so moving a worker is just changing the role new requests see; requests in flight finish
where they are.

Pressure of a pool = the pool's load / (its size x slots per worker), where a worker's load is the larger
of the gateway's in-flight count for it and the worker's own ``running + waiting`` (from ``GET /load``,
polled by the health loop; the larger one also covers other gateway replicas' traffic). ``prefill_slots``
and ``decode_slots`` say how many concurrent requests one worker of each pool takes before it queues.

A move to a pool happens when, for its pressure ``p`` and the other pool's ``q``: ``p >= min_pressure``
and ``p >= ratio * q`` (the saturated side), the donor pool keeps ``min_pool`` workers, the moved worker
stayed in its pool at least ``dwell_s``, and the move would not make the donor side cross the same
threshold the other way (hysteresis: no ping-pong). At most one worker moves per tick; the least loaded
eligible one goes. ``decide`` is pure (unit-tested with a fake clock); ``PoolBalancer`` applies it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.settings import PoolSettings, parse_pool_settings
from policies.api import Role

if TYPE_CHECKING:
    from gateway.fleet.registry import Fleet
    from gateway.state.protocols import LoadBoard

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Member:
    """One worker as the balancer sees it."""

    id: str
    capable: Role  # the role it registered with
    pool: Role  # the pool it serves in now
    available: bool
    load: int
    since: float  # when it entered this pool


@dataclass(frozen=True, slots=True)
class Move:
    worker: str
    to: Role
    reason: str


@dataclass(frozen=True, slots=True)
class _Pool:
    size: int
    load: int
    slots: float

    @classmethod
    def of(cls, members: Iterable[Member], role: Role, slots: float) -> _Pool:
        mine = [m.load for m in members if m.pool is role and m.available]
        return cls(len(mine), sum(mine), slots)

    def pressure(self, delta: int = 0) -> float:
        """Load per slot, with ``delta`` more (or fewer) workers."""
        size = self.size + delta
        return self.load / (size * self.slots) if size > 0 else 0.0


def _saturated(hot: float, cold: float, settings: PoolSettings) -> bool:
    return hot >= settings.min_pressure and hot >= settings.ratio * cold


def initial_pool(pools: Iterable[Role]) -> Role:
    """The pool a new ``both`` worker joins, given the others' pools: the smaller one (ties: decode)."""
    pools = list(pools)
    prefill = sum(1 for p in pools if p is Role.PREFILL)
    decode = sum(1 for p in pools if p is Role.DECODE)
    return Role.PREFILL if prefill < decode else Role.DECODE


def decide(members: Sequence[Member], now: float, settings: PoolSettings) -> Move | None:
    """The one move to make now, or None (pure: same input, same answer)."""
    pools = {
        Role.PREFILL: _Pool.of(members, Role.PREFILL, settings.prefill_slots),
        Role.DECODE: _Pool.of(members, Role.DECODE, settings.decode_slots),
    }
    for to, src in ((Role.PREFILL, Role.DECODE), (Role.DECODE, Role.PREFILL)):
        hot, cold = pools[to], pools[src]
        if not _saturated(hot.pressure(), cold.pressure(), settings) or cold.size <= settings.min_pool:
            continue
        if _saturated(cold.pressure(-1), hot.pressure(+1), settings):
            continue  # the move would saturate the donor pool: stay (no ping-pong)
        movable = [
            m
            for m in members
            if m.capable is Role.BOTH and m.available and m.pool is src and now - m.since >= settings.dwell_s
        ]
        if movable:
            pick = min(movable, key=lambda m: (m.load, m.id))
            return Move(pick.id, to, f"{to} pressure {hot.pressure():.2f} vs {src} {cold.pressure():.2f}")
    return None


@dataclass(slots=True)
class PoolState:
    """What the balancer remembers of one worker (shown by ``GET /admin/workers``)."""

    capable: Role
    pool: Role
    since: float
    reason: str
    moves: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "capable": str(self.capable),
            "pool": str(self.pool),
            "reason": self.reason,
            "moves": self.moves,
        }


@dataclass(slots=True)
class PoolBalancer:
    """Applies ``decide`` to the fleet every ``settings.interval_s``.

    Args:
        fleet: the registry (``WorkerRecord.role`` of ``both``-capable workers is set to their pool).
        load: the gateway's in-flight accounting.
        settings: thresholds.
        clock: monotonic seconds (injected for tests).
    """

    fleet: Fleet
    load: LoadBoard
    settings: PoolSettings
    clock: Callable[[], float]
    states: dict[str, PoolState] = field(default_factory=dict)

    def describe(self, worker_id: str) -> dict[str, Any] | None:
        state = self.states.get(worker_id)
        return state.to_dict() if state is not None else None

    def members(self) -> list[Member]:
        """The fleet as ``decide`` sees it; registers workers seen for the first time."""
        now = self.clock()
        out: list[Member] = []
        for record in self.fleet:
            state = self.states.get(record.id)
            if state is None:
                state = PoolState(record.role, record.role, now, f"registered as {record.role}")
                if record.role is Role.BOTH:
                    state.pool = initial_pool(s.pool for s in self.states.values())
                    state.reason = f"both-capable: joined the smaller pool ({state.pool})"
                self.states[record.id] = state
            record.role = state.pool
            inflight = self.load.get(record.id).inflight_requests
            load = max(inflight, record.running + record.queue_depth)
            out.append(Member(record.id, state.capable, state.pool, record.available, load, state.since))
        for gone in set(self.states) - {m.id for m in out}:
            del self.states[gone]
        return out

    def tick(self) -> Move | None:
        """One balancing step: register new workers, maybe move one."""
        move = decide(self.members(), self.clock(), self.settings)
        if move is not None:
            self._apply(move)
        return move

    def _apply(self, move: Move) -> None:
        record, state = self.fleet.get(move.worker), self.states[move.worker]
        if record is None:
            return
        record.role = move.to
        self.states[move.worker] = replace(
            state, pool=move.to, since=self.clock(), reason=move.reason, moves=state.moves + 1
        )
        logger.info("worker moved to %s pool: %s", move.to, move.reason, extra={"worker": move.worker})

    async def run(self) -> None:
        """Balance forever (until cancelled); the first tick, at once, assigns the initial pools."""
        while True:
            try:
                self.tick()
            except Exception:  # a background loop must survive anything; the next tick retries
                logger.exception("role pool tick failed")
            await asyncio.sleep(self.settings.interval_s)


def build_balancer(
    spec: str, *, disaggregates: bool, fleet: Fleet, load: LoadBoard, clock: Callable[[], float]
) -> PoolBalancer | None:
    """The balancer ``--role-pools`` asks for: ``auto`` runs it only under a PD policy.

    Raises:
        ValueError: a bad spec.
    """
    settings = parse_pool_settings(spec)
    if not settings.enabled or (spec.strip() in ("", "auto") and not disaggregates):
        return None
    return PoolBalancer(fleet, load, settings, clock)

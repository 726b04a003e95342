"""``session_affinity``: requests of one session go to the same worker, so its KV stays warm.

What it does:
    The session id comes from ``RouteRequest.session_id`` (the gateway fills it from the
    ``x-session-id`` header or the body's ``user`` field). A new session goes to the worker that wins
    rendezvous (highest-random-weight) hashing of session id and worker id: every gateway replica agrees
    without shared state, and removing a worker moves only its own sessions. Once routed, a session is
    remembered in a bounded table with a TTL, so it stays on its worker even when workers join later
    (rendezvous alone would move a share of sessions to a newcomer, away from their cache). When the
    remembered worker is gone or unhealthy, the session is re-hashed over the healthy workers. Requests
    without a session id go to the least loaded worker.

Inputs (needs):
    The session id and the worker list; nothing that needs tokenizing.

Parameters:
    max_sessions: table capacity; the least recently routed session is dropped first (default 100000).
    ttl_s: a session not routed for this long is forgotten (default 600.0).

Example config:
    policy:
      type: session_affinity
      params: {max_sessions: 50000, ttl_s: 300}

Limitations:
    Ignores load for sessions: one very busy session can overload its worker. The table is per replica;
    replicas agree through the hash, not the table, so after a fleet change they may differ until
    entries expire.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from hashlib import blake2b

from policies.api import Decision, Need, Outcome, PolicyContext, RouteRequest, WorkerId, WorkerView
from policies.builtin.least_load import least_loaded
from policies.candidates import SERVING_ROLES, candidates
from policies.plugins import Kind, define


@dataclass(frozen=True, slots=True)
class SessionAffinityParams:
    max_sessions: int = 100_000
    ttl_s: float = 600.0

    def validate(self) -> None:
        if self.max_sessions <= 0:
            raise ValueError("max_sessions must be > 0")
        if self.ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")


def rendezvous_weight(session_id: str, worker: WorkerId) -> int:
    """A stable pseudo-random weight of (session, worker), the same in every process."""
    digest = blake2b(f"{session_id}\x00{worker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class SessionAffinity:
    """Sticky sessions: rendezvous hashing plus a bounded TTL table."""

    name = "session_affinity"
    needs: frozenset[Need] = frozenset()

    def __init__(self, params: SessionAffinityParams, clock: Callable[[], float], rng: random.Random) -> None:
        self._max = params.max_sessions
        self._ttl = params.ttl_s
        self._clock = clock
        self._rng = rng
        self._table: OrderedDict[str, tuple[WorkerId, float]] = OrderedDict()

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, SERVING_ROLES)
        if not pool:
            return Decision(worker=None, reason="no healthy serving worker")
        sid = req.session_id
        if not sid:
            chosen = least_loaded(pool, self._rng)
            return Decision(worker=chosen.id, scores={chosen.id: 1.0}, reason="no session: least loaded")
        entry = self._table.get(sid)
        if entry is not None and entry[1] > self._clock():
            for w in pool:
                if w.id == entry[0]:
                    return Decision(worker=w.id, scores={w.id: 1.0}, reason="session table")
        best = max(pool, key=lambda w: rendezvous_weight(sid, w.id))
        return Decision(worker=best.id, scores={best.id: 1.0}, reason="session hash")

    def on_routed(self, req: RouteRequest, decision: Decision) -> None:
        sid = req.session_id
        if not sid or decision.worker is None:
            return
        now = self._clock()
        table = self._table
        table[sid] = (decision.worker, now + self._ttl)
        table.move_to_end(sid)
        while table:
            oldest_sid, (_, expires) = next(iter(table.items()))
            if len(table) <= self._max and expires > now:
                break
            del table[oldest_sid]

    def on_finished(self, outcome: Outcome) -> None:
        return None

    def __len__(self) -> int:
        return len(self._table)


def _build(ctx: PolicyContext, params: SessionAffinityParams) -> SessionAffinity:
    return SessionAffinity(params, ctx.clock, ctx.rng)


PLUGINS = (define("session_affinity", Kind.POLICY, SessionAffinityParams, _build),)

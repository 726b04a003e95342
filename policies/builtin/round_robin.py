"""``round_robin``: each request goes to the next serving worker in id order.
Compiled with mypyc (``docs/development.md``: what that rules out).

What it does:
    Keeps a cursor: the id of the worker it last routed to. The next request goes to the first candidate
    whose id sorts after it (wrapping around), so workers joining or leaving the fleet do not reshuffle
    the order. The cursor moves in ``on_routed``, so explaining a decision (``/admin/route``) does not
    advance it.

Inputs (needs):
    Nothing beyond the worker list (health and role).

Parameters:
    None.

Example config:
    policy:
      type: round_robin

Limitations:
    Ignores load and cache: one slow worker gets as many requests as a fast one. Each gateway replica has
    its own cursor.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate_core.frozen import fast_constructor
from policies.api import Decision, Need, Outcome, Role, RouteRequest, WorkerId, WorkerView
from policies.candidates import SERVING_ROLES, candidates
from policies.plugins import Kind, NoParams, define

_decision = fast_constructor(Decision)  # one per request


class RoundRobin:
    """Cycles through serving workers in id order."""

    name = "round_robin"
    needs: frozenset[Need] = frozenset()

    def __init__(self, roles: frozenset[Role] = SERVING_ROLES) -> None:
        self._roles = roles
        self._last: WorkerId | None = None

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, self._roles)
        if not pool:
            return _decision(worker=None, reason="no healthy serving worker")
        last = self._last
        nxt: WorkerView | None = None
        first = pool[0]
        for w in pool:
            if w.id < first.id:
                first = w
            if last is not None and w.id > last and (nxt is None or w.id < nxt.id):
                nxt = w
        chosen = nxt or first
        return _decision(worker=chosen.id, scores={chosen.id: 1.0}, reason="next in turn")

    def on_routed(self, req: RouteRequest, decision: Decision) -> None:
        if decision.worker is not None:
            self._last = decision.worker

    def on_finished(self, outcome: Outcome) -> None:
        return None


PLUGINS = (define("round_robin", Kind.POLICY, NoParams, lambda ctx, p: RoundRobin()),)

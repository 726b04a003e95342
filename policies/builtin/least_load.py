"""``least_load``: each request goes to the serving worker with the fewest in-flight tokens.

What it does:
    Orders healthy serving workers by in-flight tokens (prompt plus expected completion tokens of the
    requests not yet finished), then in-flight requests, then queue depth, and takes the least loaded.
    Ties are broken with the seeded RNG, so replicas that see the same idle fleet do not herd.

Inputs (needs):
    Nothing beyond the load snapshot.

Parameters:
    None.

Example config:
    policy:
      type: least_load

Limitations:
    Ignores the KV cache, so a conversation's later turns rarely find their prefix. The load figures are
    the gateway's own accounting (shared by replicas with ``--state redis://``), which lags the workers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.api import Decision, Need, Role, RouteRequest, WorkerId, WorkerView
from policies.candidates import SERVING_ROLES, candidates, choose_tied
from policies.plugins import Kind, NoParams, define


def load_key(w: WorkerView) -> tuple[int, int, int]:
    """How busy a worker is, most significant figure first."""
    return (w.inflight_tokens, w.inflight_requests, w.queue_depth)


def least_loaded(pool: Sequence[WorkerView], rng: random.Random) -> WorkerView:
    """The least loaded of a non-empty ``pool``; a seeded draw among equals."""
    fewest = min(w.inflight_tokens for w in pool)
    tied = [w for w in pool if w.inflight_tokens == fewest]  # cheap first pass; tuples only for ties
    if len(tied) > 1:
        best = min(load_key(w) for w in tied)
        tied = [w for w in tied if load_key(w) == best]
    return choose_tied(rng, tied)


def load_scores(pool: Sequence[WorkerView]) -> dict[WorkerId, float]:
    """``1 - tokens/max_tokens`` per worker, for explanations."""
    busiest = max(w.inflight_tokens for w in pool)
    if busiest <= 0:
        return {w.id: 1.0 for w in pool}
    return {w.id: 1.0 - max(w.inflight_tokens, 0) / busiest for w in pool}


class LeastLoad:
    """The serving worker with the fewest in-flight tokens, then requests."""

    name = "least_load"
    needs: frozenset[Need] = frozenset()

    def __init__(self, rng: random.Random, roles: frozenset[Role] = SERVING_ROLES) -> None:
        self._rng = rng
        self._roles = roles

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, self._roles)
        if not pool:
            return Decision(worker=None, reason="no healthy serving worker")
        chosen = least_loaded(pool, self._rng)
        return Decision(worker=chosen.id, scores=load_scores(pool), reason="fewest in-flight tokens")


PLUGINS = (define("least_load", Kind.POLICY, NoParams, lambda ctx, p: LeastLoad(ctx.rng)),)

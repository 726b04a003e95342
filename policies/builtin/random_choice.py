"""``random``: each request goes to a serving worker drawn uniformly with the seeded RNG.

What it does:
    Draws one healthy serving worker uniformly at random from the context's seeded RNG (so a fixed seed
    gives a fixed sequence of decisions).

Inputs (needs):
    Nothing beyond the worker list (health and role).

Parameters:
    None.

Example config:
    policy:
      type: random

Limitations:
    Ignores load and cache; short-term imbalance is common with few requests.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.api import Decision, Need, RouteRequest, WorkerView
from policies.candidates import SERVING_ROLES, candidates
from policies.plugins import Kind, NoParams, define


class RandomChoice:
    """A uniform draw among serving workers."""

    name = "random"
    needs: frozenset[Need] = frozenset()

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, SERVING_ROLES)
        if not pool:
            return Decision(worker=None, reason="no healthy serving worker")
        chosen = pool[self._rng.randrange(len(pool))]
        return Decision(worker=chosen.id, scores={chosen.id: 1.0}, reason="uniform draw")


PLUGINS = (define("random", Kind.POLICY, NoParams, lambda ctx, p: RandomChoice(ctx.rng)),)

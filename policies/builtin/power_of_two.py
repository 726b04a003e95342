"""``power_of_two``: draw two serving workers at random and take the less loaded one.

What it does:
    Draws two distinct healthy serving workers with the seeded RNG and sends the request to the one with
    fewer in-flight tokens (then requests, then queue depth). With one candidate, that one. This keeps
    most of ``least_load``'s balance while several gateway replicas with stale load figures do not all
    pick the same "least loaded" worker.

Inputs (needs):
    Nothing beyond the load snapshot.

Parameters:
    None.

Example config:
    policy:
      type: power_of_two

Limitations:
    Ignores the KV cache. Only two workers are compared, so it does not always find the least loaded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.api import Decision, Need, RouteRequest, WorkerView
from policies.builtin.least_load import load_key
from policies.candidates import SERVING_ROLES, candidates
from policies.plugins import Kind, NoParams, define


class PowerOfTwo:
    """The less loaded of two random serving workers."""

    name = "power_of_two"
    needs: frozenset[Need] = frozenset()

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, SERVING_ROLES)
        if not pool:
            return Decision(worker=None, reason="no healthy serving worker")
        if len(pool) == 1:
            only = pool[0]
            return Decision(worker=only.id, scores={only.id: 1.0}, reason="only candidate")
        i, j = self._rng.sample(range(len(pool)), 2)
        a, b = pool[i], pool[j]
        chosen, other = (a, b) if load_key(a) <= load_key(b) else (b, a)
        return Decision(
            worker=chosen.id, scores={chosen.id: 1.0, other.id: 0.0}, reason="less loaded of two draws"
        )


PLUGINS = (define("power_of_two", Kind.POLICY, NoParams, lambda ctx, p: PowerOfTwo(ctx.rng)),)

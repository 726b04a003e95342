"""``lowest_id``: every request goes to the healthy serving worker whose id sorts first.

Deterministic and load-blind: useful as a plugin example and for pinning traffic in tests.

Example config::

    policy:
      type: lowest_id
      params: {skip_prefix: "canary-"}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies import SERVING_ROLES, Decision, Need, PolicyContext, RouteRequest, WorkerView, parse_params


@dataclass(frozen=True, slots=True)
class LowestIdParams:
    """Params of ``lowest_id``.

    Attributes:
        skip_prefix: worker ids starting with this are never chosen ("" skips none).
    """

    skip_prefix: str = ""


class LowestId:
    """Routes to the healthy ``both`` worker with the smallest id."""

    name = "lowest_id"
    needs: frozenset[Need] = frozenset()

    def __init__(self, params: LowestIdParams) -> None:
        self._skip = params.skip_prefix

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = [
            w
            for w in workers
            if w.healthy and w.role in SERVING_ROLES and not (self._skip and w.id.startswith(self._skip))
        ]
        if not pool:
            return Decision(worker=None, reason="no eligible worker")
        chosen = min(pool, key=lambda w: w.id)
        return Decision(worker=chosen.id, scores={w.id: float(w is chosen) for w in pool}, reason="lowest id")


def make(ctx: PolicyContext, params: Mapping[str, Any]) -> LowestId:
    """The entry point: validate ``params`` and build the policy."""
    return LowestId(parse_params(LowestIdParams, params, "policy 'lowest_id'"))

"""The pipeline policy: filters, then weighted scorers, then a picker.

``healthy`` and the serving-role rule (see ``policies.candidates``) are applied implicitly before the
configured filters, so a pipeline never returns an unhealthy worker or one whose role cannot serve the
request. Each scorer's output is clamped to [0, 1]; a worker's score is the weighted mean of its scorers'
outputs, so it stays in [0, 1] too. ``needs`` is the union of the parts' ``needs`` attributes (a part
without one reads nothing beyond the load snapshot).
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.api import (
    Decision,
    Filter,
    Need,
    Observer,
    Outcome,
    Picker,
    Role,
    RouteRequest,
    Scorer,
    WorkerId,
    WorkerView,
)
from policies.candidates import SERVING_ROLES, candidates


class Pipeline:
    """Filters → weighted scorers → picker, implementing ``Policy`` (and ``Observer`` for its parts)."""

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        roles: frozenset[Role] = SERVING_ROLES,
    ) -> None:
        self.name = name
        self._filters = tuple(filters)
        self._scorers = tuple((s, w) for s, w in scorers if w > 0)
        self._total_weight = sum(w for _, w in self._scorers)
        self._picker = picker
        self._roles = roles
        parts: list[object] = [*self._filters, *(s for s, _ in self._scorers), picker]
        self.needs: frozenset[Need] = frozenset().union(*(getattr(p, "needs", frozenset()) for p in parts))
        self._observers = tuple(p for p in parts if isinstance(p, Observer))

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        """Choose a worker; ``Decision.scores`` holds each surviving candidate's combined score."""
        pool: Sequence[WorkerView] = candidates(workers, self._roles)
        for flt in self._filters:
            if not pool:
                break
            pool = flt.filter(req, pool)
        if not pool:
            return Decision(worker=None, reason="no healthy worker passed the filters")
        combined = self._combine(req, pool)
        chosen = self._picker.pick(req, [(w, combined[w.id]) for w in pool])
        if chosen is None:
            return Decision(worker=None, scores=combined, reason="picker chose no worker")
        return Decision(worker=chosen.id, scores=combined, reason=f"{self.name}: {self._picker.name}")

    def _combine(self, req: RouteRequest, pool: Sequence[WorkerView]) -> dict[WorkerId, float]:
        if not self._scorers:
            return {w.id: 1.0 for w in pool}
        total: dict[WorkerId, float] = dict.fromkeys((w.id for w in pool), 0.0)
        for scorer, weight in self._scorers:
            scores = scorer.score(req, pool)
            for wid in total:
                s = scores.get(wid, 0.0)
                total[wid] += weight * (0.0 if s < 0.0 else 1.0 if s > 1.0 else s)
        inv = 1.0 / self._total_weight
        return {wid: s * inv for wid, s in total.items()}

    def on_routed(self, req: RouteRequest, decision: Decision) -> None:
        """Forward to the parts that keep state."""
        for obs in self._observers:
            obs.on_routed(req, decision)

    def on_finished(self, outcome: Outcome) -> None:
        """Forward to the parts that keep state."""
        for obs in self._observers:
            obs.on_finished(outcome)

"""Pickers for pipelines: ``max_score`` and ``weighted_random``.

What it does:
    ``max_score`` takes the highest-scoring worker; workers within ``tie_epsilon`` of the best are drawn
    from with the seeded RNG, so gateway replicas do not all herd onto one worker. ``weighted_random``
    draws a worker with probability proportional to its score (uniformly when every score is 0).

Inputs (needs):
    Only the scores.

Parameters:
    max_score.tie_epsilon: scores this close to the best count as a tie (default 1e-9).

Example config:
    policy:
      type: pipeline
      scorers: [queue_depth]
      picker: {type: max_score, params: {tie_epsilon: 0.01}}

Limitations:
    ``weighted_random`` spreads load but ignores how much better the best worker is.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.api import RouteRequest, WorkerView
from policies.candidates import choose_tied
from policies.plugins import Kind, NoParams, define


@dataclass(frozen=True, slots=True)
class MaxScoreParams:
    tie_epsilon: float = 1e-9

    def validate(self) -> None:
        if self.tie_epsilon < 0:
            raise ValueError("tie_epsilon must be >= 0")


class MaxScorePicker:
    """The best-scoring worker; seeded draw among ties."""

    name = "max_score"

    def __init__(self, params: MaxScoreParams, rng: random.Random) -> None:
        self._eps = params.tie_epsilon
        self._rng = rng

    def pick(self, req: RouteRequest, scored: Sequence[tuple[WorkerView, float]]) -> WorkerView | None:
        if not scored:
            return None
        best = max(s for _, s in scored)
        floor = best - self._eps
        return choose_tied(self._rng, [w for w, s in scored if s >= floor])


class WeightedRandomPicker:
    """A draw proportional to score."""

    name = "weighted_random"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, req: RouteRequest, scored: Sequence[tuple[WorkerView, float]]) -> WorkerView | None:
        if not scored:
            return None
        weights = [max(s, 0.0) for _, s in scored]
        total = sum(weights)
        if total <= 0:
            return scored[self._rng.randrange(len(scored))][0]
        x = self._rng.random() * total
        for (worker, _), weight in zip(scored, weights, strict=True):
            x -= weight
            if x < 0:
                return worker
        return next(w for (w, _), wt in zip(reversed(scored), reversed(weights), strict=True) if wt > 0)


PLUGINS = (
    define("max_score", Kind.PICKER, MaxScoreParams, lambda ctx, p: MaxScorePicker(p, ctx.rng)),
    define("weighted_random", Kind.PICKER, NoParams, lambda ctx, p: WeightedRandomPicker(ctx.rng)),
)

"""Scorers for pipelines: ``prefix_hit``, ``queue_depth``, ``inflight_tokens`` and ``kv_usage``.

What it does:
    Each scorer maps every candidate to [0, 1], 1 best. ``prefix_hit`` is the share of the request's blocks
    a worker already holds (blocks in the shared tier count ``tier_weight`` each). ``queue_depth`` is
    ``1 - queue/saturation``. ``inflight_tokens`` is ``1 - tokens/max_tokens`` relative to the busiest
    candidate. ``kv_usage`` is ``1 - kv_usage``.

Inputs (needs):
    ``prefix_hit`` needs block hashes and prefix hits; the others read only the load snapshot.

Parameters:
    prefix_hit.tier_weight: what a block in the shared dram/ssd tier is worth next to one in the worker's
        own cache (default 0.5).
    queue_depth.saturation: the queue depth that scores 0 (default 32).

Example config:
    policy:
      type: pipeline
      scorers:
        - {type: prefix_hit, weight: 3, params: {tier_weight: 0.5}}
        - {type: queue_depth, weight: 1, params: {saturation: 16}}
        - {type: inflight_tokens, weight: 1}
        - {type: kv_usage, weight: 0.5}
      picker: max_score

Limitations:
    A weighted sum of scores is a heuristic: weights need tuning per workload. The ``prefix_cache_aware``
    policy replaces it with an explicit time-to-first-token cost model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.api import Need, RouteRequest, WorkerId, WorkerView
from policies.plugins import Kind, NoParams, define


@dataclass(frozen=True, slots=True)
class PrefixHitParams:
    tier_weight: float = 0.5

    def validate(self) -> None:
        if not 0.0 <= self.tier_weight <= 1.0:
            raise ValueError("tier_weight must be in [0, 1]")


class PrefixHitScorer:
    """Share of the request's blocks found on the worker (tier blocks discounted)."""

    name = "prefix_hit"
    needs = frozenset({Need.BLOCK_HASHES, Need.PREFIX_HITS})

    def __init__(self, params: PrefixHitParams) -> None:
        self._tier_weight = params.tier_weight

    def score(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Mapping[WorkerId, float]:
        total = len(req.block_hashes)
        if total == 0:
            return {w.id: 0.0 for w in workers}
        tw = self._tier_weight
        return {w.id: min(1.0, (w.gpu_hit_blocks + tw * w.tier_hit_blocks) / total) for w in workers}


@dataclass(frozen=True, slots=True)
class QueueDepthParams:
    saturation: int = 32

    def validate(self) -> None:
        if self.saturation <= 0:
            raise ValueError("saturation must be > 0")


class QueueDepthScorer:
    """Shorter queues score higher; ``saturation`` or deeper scores 0."""

    name = "queue_depth"

    def __init__(self, params: QueueDepthParams) -> None:
        self._sat = params.saturation

    def score(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Mapping[WorkerId, float]:
        sat = self._sat
        return {w.id: 1.0 - min(w.queue_depth, sat) / sat for w in workers}


class InflightTokensScorer:
    """Fewer in-flight tokens score higher, relative to the busiest candidate."""

    name = "inflight_tokens"

    def score(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Mapping[WorkerId, float]:
        busiest = max((w.inflight_tokens for w in workers), default=0)
        if busiest <= 0:
            return {w.id: 1.0 for w in workers}
        return {w.id: 1.0 - max(w.inflight_tokens, 0) / busiest for w in workers}


class KVUsageScorer:
    """Emptier KV caches score higher."""

    name = "kv_usage"

    def score(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Mapping[WorkerId, float]:
        return {w.id: 1.0 - min(max(w.kv_usage, 0.0), 1.0) for w in workers}


PLUGINS = (
    define("prefix_hit", Kind.SCORER, PrefixHitParams, lambda ctx, p: PrefixHitScorer(p)),
    define("queue_depth", Kind.SCORER, QueueDepthParams, lambda ctx, p: QueueDepthScorer(p)),
    define("inflight_tokens", Kind.SCORER, NoParams, lambda ctx, p: InflightTokensScorer()),
    define("kv_usage", Kind.SCORER, NoParams, lambda ctx, p: KVUsageScorer()),
)

"""``prefix_cache_aware``: send each request where its time to first token is estimated lowest.

What it does:
    A cost model, not a threshold switch. For each healthy serving worker it estimates the time to first
    token in prefill-token units::

        cost = backlog + uncached + tier_pull_cost * tier
        backlog = inflight_tokens + queue_depth * queued_request_tokens

    where ``uncached`` are this request's prompt tokens in neither the worker's cache nor the shared tier,
    and ``tier`` the tokens it would pull from the shared dram/ssd tier. Dividing by
    ``prefill_tokens_per_s`` gives seconds (shown in the reason). The cheapest worker wins, so a warm
    worker is preferred exactly as long as its extra queue costs less than the prefill it saves.
    Hotspot guards: a worker loses its cache credit (``cost = backlog + prompt``) when its backlog exceeds
    the fleet mean by more than ``hotspot_margin`` (and by more than ``hotspot_min_tokens``), or when the
    prompt tokens this gateway routed to it recently (decayed with ``balance_half_life_s``) exceed the
    fleet mean by more than ``balance_margin`` (and by more than ``balance_min_tokens``). The first guard
    copies a hot prefix to a second, less loaded worker instead of queueing on one; the second keeps
    sticky traffic (sessions, prefix groups, all of whose later requests follow their cache) spread
    evenly over time, which an instantaneous backlog cannot see at moderate load. Ties go to the worker
    with the least recent load, then to the seeded RNG.

Inputs (needs):
    Prompt token count, block hashes and per-worker prefix hits (worker cache and shared tier), and load.

Parameters:
    prefill_tokens_per_s: assumed prefill rate, used to report the estimate in seconds; it does not change
        the ranking (default 8000.0).
    tier_pull_cost: cost of pulling a token's KV from the shared tier relative to recomputing it
        (default 0.1).
    queued_request_tokens: prefill work assumed per request waiting in a worker's queue (default 256).
    hotspot_margin: relative excess over the mean backlog that marks a worker hot (default 0.5).
    hotspot_min_tokens: absolute excess over the mean backlog a hot worker must also have (default 4096).
    balance_margin: relative excess over the mean recent load that marks a worker hot (default 0.1).
    balance_min_tokens: absolute excess over the mean recent load a hot worker must also have
        (default 16384).
    balance_half_life_s: half-life of the recent-load figures, in seconds (default 30.0).

Example config:
    policy:
      type: prefix_cache_aware
      params: {tier_pull_cost: 0.1, hotspot_margin: 0.5}

Limitations:
    The estimate is only as good as the index's hits and the load figures; in-flight tokens count
    completion tokens as if they were prefill work. Predicted hits of requests still in flight are
    credited as if already cached. The recent load is each gateway replica's own view (what it routed);
    replicas balance their own shares. Inside ``pd_disaggregation`` the recent load is not tracked
    (sub-policies get no routing hooks), so only the backlog guard applies there.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies.api import (
    Decision,
    Need,
    Outcome,
    PolicyContext,
    Role,
    RouteRequest,
    WorkerId,
    WorkerView,
)
from policies.candidates import SERVING_ROLES, candidates, choose_tied
from policies.plugins import Kind, define

NEEDS = frozenset({Need.TOKENS, Need.BLOCK_HASHES, Need.PREFIX_HITS})


@dataclass(frozen=True, slots=True)
class CacheCostParams:
    prefill_tokens_per_s: float = 8000.0
    tier_pull_cost: float = 0.1
    queued_request_tokens: int = 256
    hotspot_margin: float = 0.5
    hotspot_min_tokens: int = 4096
    balance_margin: float = 0.1
    balance_min_tokens: int = 16384
    balance_half_life_s: float = 30.0

    def validate(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.balance_half_life_s <= 0:
            raise ValueError("prefill_tokens_per_s and balance_half_life_s must be > 0")
        if not 0.0 <= self.tier_pull_cost <= 1.0:
            raise ValueError("tier_pull_cost must be in [0, 1]")
        if (
            min(self.queued_request_tokens, self.hotspot_min_tokens, self.balance_min_tokens) < 0
            or min(self.hotspot_margin, self.balance_margin) < 0
        ):
            raise ValueError("token counts and margins must be >= 0")


class RecentLoad:
    """Prompt tokens routed per worker, decaying exponentially with a half-life."""

    __slots__ = ("_at", "_clock", "_load", "_rate")

    def __init__(self, half_life_s: float, clock: Callable[[], float]) -> None:
        self._rate = math.log(2.0) / half_life_s
        self._clock = clock
        self._at = clock()
        self._load: dict[WorkerId, float] = {}

    def _decay(self) -> None:
        now = self._clock()
        factor = math.exp(-self._rate * (now - self._at)) if now > self._at else 1.0
        self._at = now
        if factor < 1.0:
            load = self._load
            for wid in load:
                load[wid] *= factor

    def add(self, worker: WorkerId, tokens: int) -> None:
        self._decay()
        self._load[worker] = self._load.get(worker, 0.0) + tokens

    def of(self, pool: Sequence[WorkerView]) -> list[float]:
        """Each pool member's recent load, in pool order (0 for workers never routed to)."""
        self._decay()
        get = self._load.get
        return [get(w.id, 0.0) for w in pool]


def _hot(values: Sequence[float], margin: float, min_excess: float) -> list[bool]:
    mean = sum(values) / len(values)
    line = max(mean * (1.0 + margin), mean + min_excess)
    return [v > line for v in values]


def ttft_costs(
    req: RouteRequest,
    pool: Sequence[WorkerView],
    p: CacheCostParams,
    block_size: int,
    recent: Sequence[float] | None = None,
) -> dict[WorkerId, float]:
    """Estimated time to first token per worker of a non-empty ``pool``, in prefill tokens.

    ``recent`` is each pool member's recent load (``RecentLoad.of``); None disables that guard.
    """
    prompt = max(req.num_prompt_tokens, len(req.block_hashes) * block_size)
    qtok = p.queued_request_tokens
    backlogs = [w.inflight_tokens + w.queue_depth * qtok for w in pool]
    hot = _hot(backlogs, p.hotspot_margin, p.hotspot_min_tokens)
    if recent is not None:
        by_history = _hot(recent, p.balance_margin, p.balance_min_tokens)
        hot = [a or b for a, b in zip(hot, by_history, strict=True)]
    pull = p.tier_pull_cost
    costs: dict[WorkerId, float] = {}
    for w, backlog, is_hot in zip(pool, backlogs, hot, strict=True):
        rest = prompt - w.gpu_hit_blocks * block_size  # prompt tokens not in the worker's cache
        cost: float
        if is_hot:
            cost = backlog + prompt
        elif rest <= 0:
            cost = backlog
        else:
            tier = w.tier_hit_blocks * block_size
            if tier > rest:
                tier = rest
            cost = backlog + rest - tier + pull * tier
        costs[w.id] = cost + 1.0
    return costs


def cheapest(
    costs: dict[WorkerId, float],
    pool: Sequence[WorkerView],
    rng: random.Random,
    recent: Sequence[float] | None = None,
) -> WorkerView:
    """The worker of least cost; among equals the least recently loaded, then a seeded draw."""
    best = min(costs.values())
    tied = [(w, i) for i, w in enumerate(pool) if costs[w.id] <= best]
    if recent is not None and len(tied) > 1:
        least = min(recent[i] for _, i in tied)
        tied = [(w, i) for w, i in tied if recent[i] <= least]
    return choose_tied(rng, [w for w, _ in tied])


class PrefixCacheAware:
    """Lowest estimated time to first token: queue + uncached prefill + tier pulls, with hotspot guards."""

    name = "prefix_cache_aware"
    needs = NEEDS

    def __init__(
        self, params: CacheCostParams, ctx: PolicyContext, roles: frozenset[Role] = SERVING_ROLES
    ) -> None:
        self._p = params
        self._rng = ctx.rng
        self._block_size = ctx.block_size
        self._roles = roles
        self._recent = RecentLoad(params.balance_half_life_s, ctx.clock)

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, self._roles)
        if not pool:
            return Decision(worker=None, reason="no healthy serving worker")
        recent = self._recent.of(pool)
        costs = ttft_costs(req, pool, self._p, self._block_size, recent)
        chosen = cheapest(costs, pool, self._rng, recent)
        best = costs[chosen.id]
        scores = {wid: best / c for wid, c in costs.items()}
        ms = best * 1000.0 / self._p.prefill_tokens_per_s
        return Decision(worker=chosen.id, scores=scores, reason=f"lowest estimated TTFT ({ms:.0f} ms)")

    def on_routed(self, req: RouteRequest, decision: Decision) -> None:
        if decision.worker is not None:
            self._recent.add(decision.worker, max(1, req.num_prompt_tokens))

    def on_finished(self, outcome: Outcome) -> None:
        return None


PLUGINS = (
    define("prefix_cache_aware", Kind.POLICY, CacheCostParams, lambda ctx, p: PrefixCacheAware(p, ctx)),
)

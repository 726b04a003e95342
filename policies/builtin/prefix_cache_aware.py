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
    Hotspot guard: a worker whose backlog exceeds the fleet mean by more than ``hotspot_margin`` (and by
    more than ``hotspot_min_tokens``) loses its cache credit, so a hot prefix gets copied to a second,
    less loaded worker instead of queueing on one. Ties are broken with the seeded RNG.

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

Example config:
    policy:
      type: prefix_cache_aware
      params: {tier_pull_cost: 0.1, hotspot_margin: 0.5}

Limitations:
    The estimate is only as good as the index's hits and the load figures; in-flight tokens count
    completion tokens as if they were prefill work. Predicted hits of requests still in flight are
    credited as if already cached.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.api import Decision, Need, PolicyContext, Role, RouteRequest, WorkerId, WorkerView
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

    def validate(self) -> None:
        if self.prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be > 0")
        if not 0.0 <= self.tier_pull_cost <= 1.0:
            raise ValueError("tier_pull_cost must be in [0, 1]")
        if self.queued_request_tokens < 0 or self.hotspot_min_tokens < 0 or self.hotspot_margin < 0:
            raise ValueError("queued_request_tokens, hotspot_margin and hotspot_min_tokens must be >= 0")


def ttft_costs(
    req: RouteRequest, pool: Sequence[WorkerView], p: CacheCostParams, block_size: int
) -> dict[WorkerId, float]:
    """Estimated time to first token per worker of a non-empty ``pool``, in prefill tokens."""
    prompt = max(req.num_prompt_tokens, len(req.block_hashes) * block_size)
    qtok = p.queued_request_tokens
    backlogs = [w.inflight_tokens + w.queue_depth * qtok for w in pool]
    mean = sum(backlogs) / len(backlogs)
    hot_line = max(mean * (1.0 + p.hotspot_margin), mean + p.hotspot_min_tokens)
    pull = p.tier_pull_cost
    costs: dict[WorkerId, float] = {}
    for w, backlog in zip(pool, backlogs, strict=True):
        rest = prompt - w.gpu_hit_blocks * block_size  # prompt tokens not in the worker's cache
        cost: float
        if backlog > hot_line:
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


def cheapest(costs: dict[WorkerId, float], pool: Sequence[WorkerView], rng: random.Random) -> WorkerView:
    """The worker of least cost; a seeded draw among equals."""
    best = min(costs.values())
    return choose_tied(rng, [w for w in pool if costs[w.id] <= best])


class PrefixCacheAware:
    """Lowest estimated time to first token: queue + uncached prefill + tier pulls, with a hotspot guard."""

    name = "prefix_cache_aware"
    needs = NEEDS

    def __init__(
        self, params: CacheCostParams, ctx: PolicyContext, roles: frozenset[Role] = SERVING_ROLES
    ) -> None:
        self._p = params
        self._rng = ctx.rng
        self._block_size = ctx.block_size
        self._roles = roles

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, self._roles)
        if not pool:
            return Decision(worker=None, reason="no healthy serving worker")
        costs = ttft_costs(req, pool, self._p, self._block_size)
        chosen = cheapest(costs, pool, self._rng)
        best = costs[chosen.id]
        scores = {wid: best / c for wid, c in costs.items()}
        ms = best * 1000.0 / self._p.prefill_tokens_per_s
        return Decision(worker=chosen.id, scores=scores, reason=f"lowest estimated TTFT ({ms:.0f} ms)")


PLUGINS = (
    define("prefix_cache_aware", Kind.POLICY, CacheCostParams, lambda ctx, p: PrefixCacheAware(p, ctx)),
)

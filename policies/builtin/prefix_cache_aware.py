"""``prefix_cache_aware``: send each request where its time to first token is estimated lowest.

What it does:
    A cost model, not a threshold switch. For each healthy serving worker it estimates the time to first
    token in prefill-token units::

        cost = backlog + uncached + tier_pull_cost * tier + balance
        backlog = inflight_weight * inflight_tokens + queue_depth * queued_request_tokens
        balance = balance_weight * max(0, recent / mean_recent - 1) * mean_prompt

    where ``uncached`` are this request's prompt tokens in neither the worker's cache nor the shared tier,
    and ``tier`` the tokens it would pull from the shared dram/ssd tier. ``recent`` is the worker's
    in-flight tokens averaged over time (half-life ``balance_half_life_s``, sampled at every decision from
    the load figures that gateway replicas share), ``mean_recent`` its fleet mean and ``mean_prompt`` the
    mean recent prompt. Dividing by ``prefill_tokens_per_s`` gives
    seconds (shown in the reason). The cheapest worker wins, so a warm worker is preferred exactly as long
    as its extra queue costs less than the prefill it saves.
    Hotspot guard: a worker whose backlog exceeds the fleet mean by more than ``hotspot_margin`` (and by
    more than ``hotspot_min_tokens``) loses its cache credit, so a hot prefix gets copied to a second,
    less loaded worker instead of queueing on one. The ``balance`` term keeps sticky traffic (sessions,
    prefix groups: every later request follows its cache) spread evenly over time, which the
    instantaneous backlog cannot see at moderate load: new sessions and cold prefixes, which save little
    anywhere, go to the workers with the least recent load, while a deep conversation moves off its warm
    worker only when that worker is far above the mean. Ties are broken with the seeded RNG.

Inputs (needs):
    Prompt token count, block hashes and per-worker prefix hits (worker cache and shared tier), and load.

Parameters:
    prefill_tokens_per_s: assumed prefill rate, used to report the estimate in seconds; it does not change
        the ranking (default 8000.0).
    tier_pull_cost: cost of pulling a token's KV from the shared tier relative to recomputing it
        (default 0.1).
    queued_request_tokens: prefill work assumed per request waiting in a worker's queue (default 256).
    inflight_weight: share of in-flight tokens counted as prefill work still to do; in-flight tokens
        include cached prompt tokens and requests already decoding (default 1.0).
    hotspot_margin: relative excess over the mean backlog that marks a worker hot (default 0.5).
    hotspot_min_tokens: absolute excess over the mean backlog a hot worker must also have (default 4096).
    balance_weight: mean prompts charged per unit of relative excess over the mean recent load; 0 turns
        the balance term off (default 3.0).
    balance_half_life_s: half-life of the time-averaged load, in seconds (default 30.0).

Example config:
    policy:
      type: prefix_cache_aware
      params: {tier_pull_cost: 0.1, hotspot_margin: 0.5, balance_weight: 3.0}

Limitations:
    The estimate is only as good as the index's hits and the load figures; in-flight tokens count
    completion tokens as if they were prefill work. Predicted hits of requests still in flight are
    credited as if already cached. The time-averaged load is sampled when requests arrive, so it is
    coarse at very low request rates, and it lags a worker that was just added by about a half-life.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies.api import (
    Decision,
    Need,
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
    inflight_weight: float = 1.0
    hotspot_margin: float = 0.5
    hotspot_min_tokens: int = 4096
    balance_weight: float = 3.0
    balance_half_life_s: float = 30.0

    def validate(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.balance_half_life_s <= 0:
            raise ValueError("prefill_tokens_per_s and balance_half_life_s must be > 0")
        if not 0.0 <= self.tier_pull_cost <= 1.0:
            raise ValueError("tier_pull_cost must be in [0, 1]")
        if self.queued_request_tokens < 0 or self.hotspot_min_tokens < 0:
            raise ValueError("queued_request_tokens and hotspot_min_tokens must be >= 0")
        if not 0.0 <= self.inflight_weight <= 1.0:
            raise ValueError("inflight_weight must be in [0, 1]")
        if self.hotspot_margin < 0 or self.balance_weight < 0:
            raise ValueError("hotspot_margin and balance_weight must be >= 0")


@dataclass(frozen=True, slots=True)
class Recent:
    """Recent load of a pool, in pool order, and the mean recent prompt scaled by how much history the
    averages hold (0 before any request or time has passed)."""

    load: Sequence[float]
    mean_prompt: float


class LoadHistory:
    """Time-averaged in-flight tokens per worker and mean prompt size, sampled at every routing decision.

    The in-flight figures come from the load snapshot, which gateway replicas share (Redis state), so every
    replica converges on the same fleet-wide history instead of each balancing its own small share.
    Averages are exponential with a half-life, weighted by the time between samples.
    """

    __slots__ = ("_at", "_avg", "_clock", "_count", "_prompt", "_rate", "_start")

    def __init__(self, half_life_s: float, clock: Callable[[], float]) -> None:
        self._rate = math.log(2.0) / half_life_s
        self._clock = clock
        self._at = self._start = clock()  # averages start at 0 here: one snapshot is no history
        self._avg: dict[WorkerId, float] = {}
        self._prompt = 0.0
        self._count = 0

    def observe(self, pool: Sequence[WorkerView], prompt_tokens: int) -> Recent:
        """Fold the pool's current in-flight tokens in; returns the averages after this sample."""
        now = self._clock()
        keep = math.exp(-self._rate * max(0.0, now - self._at))
        self._at = now
        avg = self._avg
        out = []
        for w in pool:
            value = avg.get(w.id, 0.0) * keep + w.inflight_tokens * (1.0 - keep)
            avg[w.id] = value
            out.append(value)
        # A plain mean over the first 100 prompts, then time-weighted (a burst at one instant still counts).
        self._count += 1
        self._prompt += (prompt_tokens - self._prompt) * max(1.0 - keep, 1.0 / min(self._count, 100))
        # How much history the averages hold (0 at start, 1 after a few half-lives) scales the term.
        confidence = 1.0 - math.exp(-self._rate * (now - self._start))
        return Recent(out, self._prompt * confidence)


def _balance(recent: Recent | None, weight: float) -> list[float] | None:
    """Extra cost per pool member for recent load above the pool's mean (None: no term)."""
    if recent is None or weight <= 0 or recent.mean_prompt <= 0:
        return None
    mean = sum(recent.load) / len(recent.load)
    if mean <= 0:
        return None
    scale = weight * recent.mean_prompt
    return [scale * (v / mean - 1.0) if v > mean else 0.0 for v in recent.load]


def ttft_costs(
    req: RouteRequest,
    pool: Sequence[WorkerView],
    p: CacheCostParams,
    block_size: int,
    recent: Recent | None = None,
) -> dict[WorkerId, float]:
    """Estimated time to first token per worker of a non-empty ``pool``, in prefill tokens.

    ``recent`` is the pool's recent load (``LoadHistory.observe``); None leaves the balance term out.
    """
    prompt = max(req.num_prompt_tokens, len(req.block_hashes) * block_size)
    qtok = p.queued_request_tokens
    iw = p.inflight_weight
    backlogs = [iw * w.inflight_tokens + w.queue_depth * qtok for w in pool]
    mean = sum(backlogs) / len(backlogs)
    hot_line = max(mean * (1.0 + p.hotspot_margin), mean + p.hotspot_min_tokens)
    balance = _balance(recent, p.balance_weight) or [0.0] * len(pool)
    pull = p.tier_pull_cost
    costs: dict[WorkerId, float] = {}
    for w, backlog, extra in zip(pool, backlogs, balance, strict=True):
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
        costs[w.id] = cost + extra + 1.0
    return costs


def cheapest(costs: dict[WorkerId, float], pool: Sequence[WorkerView], rng: random.Random) -> WorkerView:
    """The worker of least cost; a seeded draw among equals (a deterministic rule would make replicas,
    which see the same shared load, herd onto one worker)."""
    best = min(costs.values())
    return choose_tied(rng, [w for w in pool if costs[w.id] <= best])


class PrefixCacheAware:
    """Lowest estimated time to first token: queue + uncached prefill + tier pulls + balance."""

    name = "prefix_cache_aware"
    needs = NEEDS

    def __init__(
        self, params: CacheCostParams, ctx: PolicyContext, roles: frozenset[Role] = SERVING_ROLES
    ) -> None:
        self._p = params
        self._rng = ctx.rng
        self._block_size = ctx.block_size
        self._roles = roles
        self._history = LoadHistory(params.balance_half_life_s, ctx.clock)

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, self._roles)
        if not pool:
            return Decision(worker=None, reason="no healthy serving worker")
        recent = self._history.observe(
            pool, max(req.num_prompt_tokens, len(req.block_hashes) * self._block_size)
        )
        costs = ttft_costs(req, pool, self._p, self._block_size, recent)
        chosen = cheapest(costs, pool, self._rng)
        best = costs[chosen.id]
        scores = {wid: best / c for wid, c in costs.items()}
        ms = best * 1000.0 / self._p.prefill_tokens_per_s
        return Decision(worker=chosen.id, scores=scores, reason=f"lowest estimated TTFT ({ms:.0f} ms)")


PLUGINS = (
    define("prefix_cache_aware", Kind.POLICY, CacheCostParams, lambda ctx, p: PrefixCacheAware(p, ctx)),
)

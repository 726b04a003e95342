"""``prefix_cache_aware``: send each request where its time to first token is estimated lowest.

What it does:
    A cost model, not a threshold switch. For each healthy serving worker it estimates the time to first
    token in prefill-token units::

        cost = backlog + uncached + tier_pull_cost * tier + balance + streams + overload
        backlog = work_ahead + queue_depth * queued_request_tokens
        work_ahead = prefill_weight * prefill_tokens + decoding_weight * (inflight_tokens - prefill_tokens)
                     (or inflight_weight * inflight_tokens where prefill_tokens is unknown)
        rate = balance_weight * mean_request / (mean_recent + 2 * mean_request)
        balance = rate * (recent - least_recent)
        streams = stream_weight * rate * follow_ups_per_stream * mean_request * (new_streams - fewest)
        overload = overload_weight * mean_request * max(0, recent - line) / (0.1 * mean_recent)
        line = max(load_bound * mean_recent, mean_recent + bound_slack_prompts * mean_request)

    where ``uncached`` are this request's prompt tokens in neither the worker's cache nor the shared tier,
    and ``tier`` the tokens it would pull from the shared dram/ssd tier. ``recent`` is the worker's share of
    recently routed tokens (``recent_tokens``: what every gateway replica routed to it, exponentially decayed
    with the gateway's ``--recent-half-life-s``, kept in the shared state so every replica balances the same
    fleet-wide figures), prompt tokens that were predicted cached on it counted at ``cached_load_weight``
    (they cost KV memory and attention but no prefill), and ``mean_request`` the mean recent request
    (prompt + completion budget, every token counted). Dividing by ``prefill_tokens_per_s`` gives seconds
    (shown in the reason). The cheapest worker wins, so a warm worker is preferred exactly as long as its
    extra queue and load cost less than the prefill it saves.
    Sticky traffic (sessions, prefix groups: every later request follows its cache) is kept even by the
    balance term, which sends new sessions and cold prefixes, which save nothing anywhere, to the workers
    that received least lately, and by a bounded-load rule: a worker whose recent load is already above
    ``load_bound`` × the fleet mean (and above the mean by ``bound_slack_prompts`` mean requests, which
    leaves a young fleet room) pays a steep overload cost (``overload_weight`` mean requests per 10% of the
    mean above that line), so its sticky traffic spills to the next-best worker, cheapest hits first, and
    that worker then holds a copy of the prefix. ``streams`` applies to a request that no worker holds more
    of, which starts a new stream wherever it lands: ``new_streams`` is how many such requests the worker
    received lately (``recent_streams``), ``fewest`` the least any worker received, and
    ``follow_ups_per_stream`` how many sticky follow-ups a new stream brings on this traffic (the pool's
    ``recent_follow_ups`` / ``recent_streams``). A young prefix group has sent one request so far, so its
    worker looks light by its recent load alone; this counts the group's traffic ahead. A hotspot is
    treated like an overload: a worker whose backlog exceeds the fleet mean by more than
    ``hotspot_margin`` (and by ``hotspot_min_tokens``) loses its cache credit, so a hot prefix gets copied
    to a second, less loaded worker instead of queueing on one. Ties are broken with the seeded RNG.

Inputs (needs):
    Prompt token count, block hashes and per-worker prefix hits (worker cache and shared tier), and load.

Parameters:
    prefill_tokens_per_s: assumed prefill rate, used to report the estimate in seconds; it does not change
        the ranking (default 8000.0).
    tier_pull_cost: cost of pulling a token's KV from the shared tier relative to recomputing it
        (default 0.1).
    queued_request_tokens: prefill work assumed per request waiting in a worker's queue (default 256).
    inflight_weight: share of in-flight tokens counted as prefill work still to do. Most in-flight
        tokens are past their prefill (decoding, or a completion budget not yet spent), and a worker
        decoding a burst's siblings interleaves a new prefill with that work rather than queueing it behind
        all of it; counted in full, they push siblings off the worker that holds their prefix (a quarter:
        trace hit/ideal 0.97 vs 0.89 in the replay, at +0.1 ms TTFT p50) (default 0.25).
    prefill_weight: share of ``prefill_tokens`` (in-flight prompt tokens not known to be past their first
        token: this gateway's requests still waiting for it, every other replica's in-flight tokens) counted
        as work ahead, once the gateway sees first tokens. Less than one: a worker's engine interleaves a
        new prefill with the ones queued, and affinity still pays for part of a queue (trace replay, 8
        stretches, 2400 prefill tokens/s per worker: TTFT p50 127.0 → 111.2 ms against in-flight tokens
        alone, 170.3 → 148.5 ms with four gateways, hit/ideal 0.911 → 0.921; unloaded, hit/ideal 0.964 →
        0.966 and p50 10.31 → 10.42 ms) (default 0.25).
    decoding_weight: share of the other in-flight tokens (requests past their first token: decoding) counted
        as work ahead; a decode step costs a new prefill little (default 0.0).
    hotspot_margin: relative excess over the mean backlog that marks a worker hot (default 0.5).
    hotspot_min_tokens: absolute excess over the mean backlog a hot worker must also have (default 4096).
    balance_weight: mean requests charged when a worker's recent load exceeds the least loaded worker's
        by the mean recent load; 0 turns the balance term off (default 1.0).
    load_bound: the recent load, relative to the fleet mean, above which a worker pays an overload cost;
        0 turns the bound off (default 1.15).
    bound_slack_prompts: mean requests of extra room under the bound, so a young fleet (a few requests
        each) does not break sessions over one request of difference (default 4.0).
    overload_weight: mean requests charged per 10% of the fleet mean that a worker's recent load is above
        the line; 0 turns the overload cost off (default 1.0).
    stream_weight: weight of the load a new stream is expected to bring. A request that no worker holds
        more of (a new session, a cold prefix, a one-off: ``policies.placement``) starts a stream where it
        lands; the gateway counts new streams and follow-ups per worker (``recent_streams`` /
        ``recent_follow_ups``). Such a request pays, per new stream its worker received lately above the
        fewest, the fleet's recent follow-ups per new stream in mean requests at the balance's rate. It
        spreads prefix groups evenly (shared prefix, one gateway: imbalance 1.26 → 1.01 in the replay) and
        fades where new streams bring few follow-ups (the trace's one-offs); 0 turns it off (default 1.0).
    cached_load_weight: share of a full token that a routed prompt token predicted cached on the worker
        counts in its recent load; 1 balances routed tokens, 0 only the work (uncached prefill + completion
        budget). Below 1, a worker holding deep sessions whose prompts are mostly cached is not taken for
        overloaded, so the bound stops spilling them (default 0.25).
    near_tie_requests: draw at random among the workers within this many mean requests of the cheapest
        that hold as much of the prompt. Several gateway replicas see each other's routing only after the
        shared state's sync interval, so requests reaching different replicas in the same instant would
        otherwise all pick the same "least loaded" worker; the draw spreads them. Unset, it is 0.1 while
        other replicas share the state (``PolicyContext.replicas``) and 0 for a lone gateway, where
        the draw only costs balance (default None: automatic).
    replica_home_requests: with several gateway replicas, each one owns every ``replicas()``-th worker in
        id order, starting at its ``replica_rank()`` (its home workers), and sends a request to its
        cheapest home worker when that one costs at most this many mean requests more than the cheapest
        worker and holds as much of the prompt (and, for a new stream, when its young streams are not
        expected to bring half a follow-up more than the cheapest worker's); else the near-tie draw
        decides. Replicas that route a burst in the same instant, before any sees the others' choices,
        then spread it over different workers instead of piling it on the one that looked least loaded
        to all. Unset, it is 0.25 while other
        replicas share the state and 0 (off) for a lone gateway (default None: automatic).

Example config:
    policy:
      type: prefix_cache_aware
      params: {tier_pull_cost: 0.1, hotspot_margin: 0.5, balance_weight: 1.0, load_bound: 1.15}

Limitations:
    The estimate is only as good as the index's hits and the load figures; in-flight tokens count at
    one fixed share whether their prefill is done or not. Predicted hits of requests still in flight are
    credited as if already cached. Recent load weighs a cached prompt token at a fixed share of a computed
    one, whatever the engine's real attention and memory cost. Other replicas' routed tokens arrive with
    the state's sync interval (50 ms with Redis).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
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
from policies.placement import is_free
from policies.plugins import Kind, define

NEEDS = frozenset({Need.TOKENS, Need.BLOCK_HASHES, Need.PREFIX_HITS})
REPLICA_NEAR_TIE = 0.1  # near_tie_requests when unset and other replicas route the same fleet
REPLICA_HOME = 0.25  # replica_home_requests when unset and other replicas route the same fleet


@dataclass(frozen=True, slots=True)
class CacheCostParams:
    prefill_tokens_per_s: float = 8000.0
    tier_pull_cost: float = 0.1
    queued_request_tokens: int = 256
    inflight_weight: float = 0.25
    prefill_weight: float = 0.25
    decoding_weight: float = 0.0
    hotspot_margin: float = 0.5
    hotspot_min_tokens: int = 4096
    balance_weight: float = 1.0
    load_bound: float = 1.15
    bound_slack_prompts: float = 4.0
    overload_weight: float = 1.0
    cached_load_weight: float = 0.25
    stream_weight: float = 1.0
    near_tie_requests: float | None = None
    replica_home_requests: float | None = None

    def validate(self) -> None:
        if self.prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be > 0")
        if not 0.0 <= self.tier_pull_cost <= 1.0:
            raise ValueError("tier_pull_cost must be in [0, 1]")
        if self.queued_request_tokens < 0 or self.hotspot_min_tokens < 0:
            raise ValueError("queued_request_tokens and hotspot_min_tokens must be >= 0")
        shares = (self.inflight_weight, self.prefill_weight, self.decoding_weight, self.cached_load_weight)
        if not all(0.0 <= x <= 1.0 for x in shares):
            raise ValueError(
                "inflight_weight, prefill_weight, decoding_weight and cached_load_weight must be in [0, 1]"
            )
        weights = (
            self.hotspot_margin,
            self.balance_weight,
            self.bound_slack_prompts,
            self.overload_weight,
            self.stream_weight,
            self.near_tie_requests or 0.0,
            self.replica_home_requests or 0.0,
        )
        if min(weights) < 0:
            raise ValueError("margins, weights and slack must be >= 0")
        if self.load_bound != 0 and self.load_bound < 1:
            raise ValueError("load_bound must be >= 1 (0 turns the bound off)")


@dataclass(frozen=True, slots=True)
class Recent:
    """Recent routed load of a pool, in pool order, and the mean recent request (prompt + budget); the new
    streams each worker received lately, and how many follow-ups a new stream brings on this traffic."""

    load: Sequence[float]
    mean_request: float
    streams: Sequence[float] = ()
    follow_ups_per_stream: float = 0.0

    @classmethod
    def of(cls, pool: Sequence[WorkerView], cached_weight: float = 1.0) -> Recent:
        """From the views' shared decayed figures: each worker's ``recent_tokens`` with the predicted cached
        part (``recent_cached_tokens``) counted at ``cached_weight``; the mean request counts every token, so
        the balance costs keep the scale of a real request whatever the weight. Follow-ups per stream are
        the pool's (at least one stream is assumed, so a young fleet's first follow-ups do not explode)."""
        off = 1.0 - cached_weight
        load = [w.recent_tokens - off * min(w.recent_cached_tokens, w.recent_tokens) for w in pool]
        requests = sum(w.recent_requests for w in pool)
        mean_request = sum(w.recent_tokens for w in pool) / requests if requests > 0 else 0.0
        streams = [w.recent_streams for w in pool]
        per_stream = sum(w.recent_follow_ups for w in pool) / max(1.0, sum(streams))
        return cls(load, mean_request, streams, per_stream)


def _balance(recent: Recent, p: CacheCostParams, new_stream: bool = False) -> list[float]:
    """Per pool member: the balance cost, plus the overload cost of a worker past the load line, plus, for a
    request that starts a new stream (``new_stream``), the load its worker's young streams will bring.

    Balance: recent load above the least loaded worker's, counted in mean requests; ``2`` mean requests per
    worker are added to the mean as a prior, so one request more or less is no imbalance in a young fleet.
    Overload: ``overload_weight`` mean requests per 10% of the mean above the line, steep enough that a
    worker past it keeps only the requests it holds the most of (cheap hits spill first, deep ones stay).
    The line is crossed by what a worker already holds, never by the request's own size, so a long prompt
    can always go to its warm worker when that worker is at the mean.
    Streams: each new stream a worker received lately above the fewest counts as the follow-ups a new
    stream brings on this traffic (mean requests each), charged at the balance's rate. A young stream has
    sent one request so far, so its worker looks light by its recent load alone; counting its follow-ups
    ahead spreads prefix groups evenly where recent load alone piles one more on a worker whose groups
    happened to be quiet. Where new streams bring few follow-ups (one-offs), the term fades.
    """
    loads, unit = recent.load, recent.mean_request
    n = len(loads)
    if unit <= 0 or n == 0:
        return [0.0] * n
    mean = sum(loads) / n
    low = min(loads)
    scale = p.balance_weight * unit / (mean + 2.0 * unit)
    costs = [scale * (v - low) for v in loads]
    if new_stream and p.stream_weight and recent.streams:
        ahead = p.stream_weight * scale * recent.follow_ups_per_stream * unit
        fewest = min(recent.streams)
        costs = [c + ahead * (s - fewest) for c, s in zip(costs, recent.streams, strict=True)]
    if not p.load_bound or not p.overload_weight:
        return costs
    line = max(p.load_bound * mean, mean + p.bound_slack_prompts * unit)
    steep = p.overload_weight * unit / (0.1 * mean)
    return [c + steep * (v - line) if v > line else c for c, v in zip(costs, loads, strict=True)]


def _work_ahead(w: WorkerView, p: CacheCostParams) -> float:
    """The in-flight work a new request waits behind on ``w``, in prefill tokens: where the gateway knows
    which requests still wait for their first token (``prefill_tokens``), their prompts at
    ``prefill_weight`` and the rest (decoding) at ``decoding_weight``; else every in-flight token at
    ``inflight_weight``."""
    if w.prefill_tokens is None:
        return p.inflight_weight * w.inflight_tokens
    rest = max(0, w.inflight_tokens - w.prefill_tokens)
    return p.prefill_weight * w.prefill_tokens + p.decoding_weight * rest


def ttft_costs(
    req: RouteRequest,
    pool: Sequence[WorkerView],
    p: CacheCostParams,
    block_size: int,
    recent: Recent | None = None,
    new_stream: bool | None = None,
) -> dict[WorkerId, float]:
    """Estimated time to first token per worker of a non-empty ``pool``, in prefill tokens.

    ``recent`` is the pool's recent routed load (``Recent.of``); None leaves balance out. ``new_stream``:
    whether the request starts a new stream (``policies.placement.is_free``; None: computed here).
    """
    prompt = max(req.num_prompt_tokens, len(req.block_hashes) * block_size)
    qtok = p.queued_request_tokens
    backlogs = [_work_ahead(w, p) + w.queue_depth * qtok for w in pool]
    mean = sum(backlogs) / len(backlogs)
    hot_line = max(mean * (1.0 + p.hotspot_margin), mean + p.hotspot_min_tokens)
    if new_stream is None:
        new_stream = is_free(pool)
    balance = _balance(recent, p, new_stream) if recent is not None else [0.0] * len(pool)
    pull = p.tier_pull_cost
    costs: dict[WorkerId, float] = {}
    for w, backlog, extra in zip(pool, backlogs, balance, strict=True):
        rest = prompt - w.gpu_hit_blocks * block_size  # prompt tokens not in the worker's cache
        cost: float
        if backlog > hot_line:
            cost = backlog + prompt  # no cache credit: the request is worth a copy of its prefix elsewhere
        elif rest <= 0:
            cost = backlog
        else:
            tier = w.tier_hit_blocks * block_size
            if tier > rest:
                tier = rest
            cost = backlog + rest - tier + pull * tier
        costs[w.id] = cost + extra + 1.0
    return costs


def cheapest(
    costs: dict[WorkerId, float],
    pool: Sequence[WorkerView],
    rng: random.Random,
    spread: float = 0.0,
    home: frozenset[WorkerId] = frozenset(),
    home_spread: float = 0.0,
) -> WorkerView:
    """The cheapest ``home`` worker within ``home_spread`` of the least cost, else a seeded draw among the
    workers within ``spread`` of it; either way only among workers that hold as much of the prompt as the
    cheapest one (a deterministic rule would make replicas, which see the same shared load, herd)."""
    best = min(pool, key=lambda w: costs[w.id])
    hit = (best.gpu_hit_blocks, best.tier_hit_blocks)
    least = costs[best.id]
    peers = [w for w in pool if (w.gpu_hit_blocks, w.tier_hit_blocks) == hit]
    if home:
        mine = [w for w in peers if w.id in home and costs[w.id] <= least + home_spread]
        if mine:
            return min(mine, key=lambda w: costs[w.id])
    return choose_tied(rng, [w for w in peers if costs[w.id] <= least + spread])


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
        self._replicas = ctx.replicas
        self._rank = ctx.replica_rank
        self._home_of: tuple[tuple[WorkerId, ...], int, int] = ((), 1, 0)  # what ``_home`` was built for
        self._home: frozenset[WorkerId] = frozenset()

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        pool = candidates(workers, self._roles)
        if not pool:
            return Decision(worker=None, reason="no healthy serving worker")
        recent = Recent.of(pool, self._p.cached_load_weight)
        new_stream = is_free(pool)
        costs = ttft_costs(req, pool, self._p, self._block_size, recent, new_stream)
        unit = recent.mean_request
        replicas = self._replicas()
        near, home_spread = self._p.near_tie_requests, self._p.replica_home_requests
        if near is None:
            near = REPLICA_NEAR_TIE if replicas > 1 else 0.0
        if home_spread is None:
            home_spread = REPLICA_HOME if replicas > 1 else 0.0
        home = self._home_workers(pool, replicas) if home_spread > 0 else frozenset()
        if home and new_stream and self._p.stream_weight:
            # a home worker takes a new stream from the cheapest worker only if its young streams are not
            # expected to bring half a follow-up more
            base = min(pool, key=lambda w: costs[w.id]).recent_streams  # the cheapest worker's
            ahead = recent.follow_ups_per_stream
            home = frozenset(w.id for w in pool if w.id in home and (w.recent_streams - base) * ahead < 0.5)
        chosen = cheapest(costs, pool, self._rng, near * unit, home, home_spread * unit)
        best = min(costs.values())
        scores = {wid: best / c for wid, c in costs.items()}
        ms = costs[chosen.id] * 1000.0 / self._p.prefill_tokens_per_s
        return Decision(worker=chosen.id, scores=scores, reason=f"lowest estimated TTFT ({ms:.0f} ms)")

    def _home_workers(self, pool: Sequence[WorkerView], replicas: int) -> frozenset[WorkerId]:
        """Every ``replicas``-th pool worker in id order from this replica's rank (cached per pool)."""
        if replicas <= 1:
            return frozenset()
        key = (tuple(w.id for w in pool), replicas, self._rank() % replicas)
        if key != self._home_of:
            self._home_of = key
            self._home = frozenset(sorted(key[0])[key[2] :: replicas])
        return self._home


PLUGINS = (
    define("prefix_cache_aware", Kind.POLICY, CacheCostParams, lambda ctx, p: PrefixCacheAware(p, ctx)),
)

"""Offline routing replay: a workload through N simulated worker caches and the REAL policy objects.

``bench_routing`` measures a live fleet (a minute a case); this replays the same sessions in simulated time
in a second or two, so a policy's balance/hit-rate trade-off can be explored before it is measured live.
What is modelled: each worker's KV cache (the engines' own ``BlockManager`` LRU, ``capacity_tokens``), a FIFO
prefill queue at ``prefill_tps`` and decode at ``decode_tps`` per sequence (the simulated worker's timing),
sessions whose next turn starts when the previous one ends (the driver's behaviour), gateway replicas as
separate policy instances (a session sticks to one replica, as the driver pins it), each with its own load
board (the gateway's ``MemoryLoadBoard`` on simulated time: in-flight = uncached prompt + completion budget,
recent routed tokens) that sees its own routing at once and the other replicas' ``sync_lag_s`` later (the
Redis state's publish interval).
What is not: the index's event lag, network and CPU time. Hits are what the chosen worker's cache holds when
the request arrives (the gateway's predictions make it see the same; other replicas see a new prefix only
once its events arrive, which this optimistically leaves out).

Run: ``python -m loadtest.route_sim [--scenarios ...] [--replicas 1,4] [--pca-params JSON] [--seeds N]
[--trace-stride 1400] [--trace-speedup 10] [--sync-lag-s 0.05] [--arrival-spread-ms 0]``. With
``--trace-stride``, seed k replays a different stretch of the trace: one stretch is a single sample, and its
hit rate swings by several points on a small change of policy (one gateway routes it deterministically).
``--arrival-spread-ms`` spaces out requests that arrive in the same instant (the trace's bursts): with four
replicas, what they gain from a shorter ``--sync-lag-s`` depends on it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gateway.settings import DEFAULT_HALF_LIFE_S
from gateway.state.memory import MemoryLoadBoard
from gateway.state.recent import RecentConfig
from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint
from loadtest.foreign_fleet import (
    WORD_BLOCK_SIZE,
    GuessedPlacement,
    WorkerFleet,
    as_words,
    worker_tokens_per_token,
)
from loadtest.ideal_cache import PromptBlocks, ideal_replay, prompt_blocks
from loadtest.workloads import Session, WorkRequest
from policies.api import Observer, Policy, PolicyContext, RouteRequest, WorkerId, WorkerView
from policies.placement import Placement, placement_of
from policies.registry import build_policy
from workers.engine.block_manager import BlockManager
from workers.sim.engine import DEFAULT_MODEL
from workers.sim.foreign import foreign_bundle


@dataclass(frozen=True, slots=True)
class SimFleet:
    """The simulated fleet: worker count, cache size and timing (the ``bench_routing`` defaults)."""

    workers: int = 8
    capacity_tokens: int = 16_384
    block_size: int = 16
    prefill_tps: float = 20_000.0
    decode_tps: float = 100.0
    #: event-less workers that count whitespace words (``--sim --foreign``; capacity, block and rates in
    #: words): the gateway hashes bytes in ``gateway_block_size`` blocks and guesses placement from its own
    #: routing (``loadtest.foreign_fleet.GuessedPlacement``)
    foreign: bool = False
    gateway_block_size: int = 64


@dataclass(slots=True)
class SimResult:
    """Totals of one replay."""

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    per_worker: list[int] = field(default_factory=list)
    prefill_per_worker: list[int] = field(default_factory=list)
    ideal_hit_rate: float = float("nan")
    prefill_capacity_tokens: float = float(
        "nan"
    )  # what the fleet could prefill from first arrival to last end

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else float("nan")

    @property
    def prefill_utilisation(self) -> float:
        """Uncached prompt tokens over what the fleet could prefill in the replay's span (as
        ``bench_routing.prefill_utilisation``)."""
        return sum(self.prefill_per_worker) / self.prefill_capacity_tokens

    @property
    def imbalance(self) -> float:
        total = sum(self.per_worker)
        return max(self.per_worker) * len(self.per_worker) / total if total else float("nan")

    @property
    def prefill_imbalance(self) -> float:
        total = sum(self.prefill_per_worker)
        return max(self.prefill_per_worker) * len(self.prefill_per_worker) / total if total else float("nan")

    def ttft_p(self, q: float) -> float:
        s = sorted(self.ttfts)
        return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


@dataclass(slots=True)
class _Worker:
    cache: BlockManager
    prefill_free_at: float = 0.0
    # (visible to other replicas from, end time, accounted tokens, replica that routed it, first token time,
    # predicted uncached prompt tokens)
    inflight: list[tuple[float, float, int, int, float, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Shared:
    """One routing decision as another replica learns it, ``sync_lag_s`` late (the shared load board and,
    on an event-less fleet, the shared routing predictions)."""

    worker: WorkerId
    tokens: int
    cached: int
    placement: Placement
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Prompt:
    """A request as the gateway hashes it (``gateway``) and as the worker caches it (``worker``)."""

    gateway: PromptBlocks
    worker: PromptBlocks


class _Replay:
    """The state of one replay: replicas (policy, load board, event-less placement guess) and workers."""

    def __init__(
        self, policy_spec: dict[str, object], fleet: SimFleet, replicas: int, seed: int, half_life_s: float,
        sync_lag_s: float,
        first_token: bool = True,
    ) -> None:  # fmt: skip
        self.now = 0.0
        self.first_token = first_token
        self.fleet, self.replicas, self.lag = fleet, replicas, sync_lag_s
        block = fleet.gateway_block_size if fleet.foreign else fleet.block_size
        self.policies: list[Policy] = [
            build_policy(
                policy_spec,
                PolicyContext(
                    clock=self.clock,
                    rng=random.Random(seed + i),
                    block_size=block,
                    replicas=lambda: replicas,
                    replica_rank=lambda i=i: i,  # type: ignore[misc]
                ),
            )
            for i in range(replicas)
        ]
        self.workers = [
            _Worker(BlockManager(fleet.capacity_tokens // fleet.block_size, fleet.block_size))
            for _ in range(fleet.workers)
        ]
        self.ids = [WorkerId(f"w{i}") for i in range(fleet.workers)]
        # the gateway's own recent-load accounting, on simulated time
        self.boards = [MemoryLoadBoard(RecentConfig(half_life_s), clock=self.clock) for _ in range(replicas)]
        self.guesses = (
            [
                GuessedPlacement(self.ids, fleet.capacity_tokens, block_size=block, clock=self.clock)
                for _ in range(replicas)
            ]
            if fleet.foreign
            else []
        )
        self.late: list[tuple[float, int, int, _Shared]] = []  # (visible at, replica, sequence, decision)
        self.gateway_bundle = byte_bundle()
        self.worker_bundle = foreign_bundle(DEFAULT_MODEL) if fleet.foreign else self.gateway_bundle
        self.result = SimResult(per_worker=[0] * fleet.workers, prefill_per_worker=[0] * fleet.workers)
        self.sent: list[PromptBlocks] = []
        self.seq = 0
        self.last_end = 0.0

    def clock(self) -> float:
        return self.now

    def prompt(self, req: WorkRequest) -> _Prompt:
        endpoint = Endpoint(req.endpoint)
        wk = prompt_blocks(req.body, endpoint, self.worker_bundle, block_size=self.fleet.block_size)
        if not self.fleet.foreign:
            return _Prompt(wk, wk)
        gw = prompt_blocks(req.body, endpoint, self.gateway_bundle, block_size=self.fleet.gateway_block_size)
        return _Prompt(gw, wk)

    def catch_up(self, at: float) -> None:
        """Apply the other replicas' decisions that have reached each replica by ``at``."""
        while self.late and self.late[0][0] <= at:
            _, other, _, d = heapq.heappop(self.late)
            self.boards[other].add_routed(d.worker, d.tokens, d.cached, d.placement)
            if self.guesses:
                self.guesses[other].index.record_routed(d.worker, d.hashes)

    def views(self, ri: int, p: _Prompt) -> list[WorkerView]:
        at, board = self.now, self.boards[ri]
        if self.guesses:
            hits = self.guesses[ri].hits(p.gateway.block_hashes, self.ids)
        else:
            hits = [
                w.cache.num_cached_prefix_blocks(p.worker.block_hashes, p.worker.num_tokens)
                for w in self.workers
            ]
        views = []
        for wid, w, hit in zip(self.ids, self.workers, hits, strict=True):
            w.inflight = [x for x in w.inflight if x[1] > at]
            seen = [x[2] for x in w.inflight if x[3] == ri or x[0] <= at]
            # a replica sees its own requests' first tokens (``Router.first_token``), not the others'
            pending = (
                sum(x[5] for x in w.inflight if x[3] == ri and x[4] > at)
                + sum(x[2] for x in w.inflight if x[3] != ri and x[0] <= at)
                if self.first_token
                else None
            )
            load = board.get(wid)
            views.append(
                WorkerView(
                    id=wid,
                    inflight_requests=len(seen),
                    inflight_tokens=sum(seen),
                    gpu_hit_blocks=hit,
                    recent_tokens=load.recent_tokens,
                    recent_requests=load.recent_requests,
                    recent_cached_tokens=load.recent_cached_tokens,
                    recent_streams=load.recent_streams,
                    recent_follow_ups=load.recent_follow_ups,
                    prefill_tokens=pending,
                )
            )
        return views

    def cache(self, w: _Worker, blocks: PromptBlocks) -> int:
        """Run ``blocks`` through ``w``'s cache; the prompt tokens it found cached."""
        cache = w.cache
        self.seq += 1
        name = f"r{self.seq}"
        if cache.blocks_for(blocks.num_tokens + blocks.output_tokens) > cache.num_total_blocks:
            return 0
        hit = cache.allocate(name, blocks.num_tokens, blocks.block_hashes, root=0) * self.fleet.block_size
        cache.append_slots(name, blocks.num_tokens + blocks.output_tokens)
        cache.commit(name, range(blocks.num_tokens))
        cache.free(name)
        return hit

    def serve(self, ri: int, session: Session, p: _Prompt) -> float:
        """Route one request from replica ``ri`` and serve it; when it ends."""
        at, gw, wk = self.now, p.gateway, p.worker
        views = self.views(ri, p)
        rreq = RouteRequest(
            model="m", num_prompt_tokens=gw.num_tokens, block_hashes=gw.block_hashes,
            session_id=session.id, max_tokens=gw.output_tokens,
        )  # fmt: skip
        policy = self.policies[ri]
        decision = policy.select(rreq, views)
        assert decision.worker is not None
        if isinstance(policy, Observer):
            policy.on_routed(rreq, decision)
        wi = self.ids.index(decision.worker)
        w = self.workers[wi]
        hit_tokens = self.cache(w, wk)
        uncached = wk.num_tokens - hit_tokens
        first = max(at, w.prefill_free_at) + uncached / self.fleet.prefill_tps
        w.prefill_free_at = first
        end = first + wk.output_tokens / self.fleet.decode_tps
        # the gateway's figures, in its tokens: what it predicted cached, the work in flight
        cached = hit_tokens
        if self.guesses:
            guess, hit_blocks = self.guesses[ri], views[wi].gpu_hit_blocks
            guess.index.record_routed(decision.worker, gw.block_hashes)
            predicted = guess.predicted(decision.worker, hit_blocks, gw.num_tokens)
            guess.finished(decision.worker, gw.num_tokens, wk.num_tokens, predicted, hit_tokens)
            cached = min(hit_blocks * self.fleet.gateway_block_size, gw.num_tokens)
        uncached_gw = gw.num_tokens - cached
        w.inflight.append((at + self.lag, end, uncached_gw + gw.output_tokens, ri, first, uncached_gw))
        routed = gw.num_tokens + gw.output_tokens
        placement = placement_of(views, decision.worker)
        self.boards[ri].add_routed(decision.worker, routed, cached, placement)
        for other in range(self.replicas):
            if other != ri:
                shared = _Shared(decision.worker, routed, cached, placement, gw.block_hashes)
                heapq.heappush(self.late, (at + self.lag, other, self.seq, shared))
        self.account(wi, wk, hit_tokens, first - at)
        self.last_end = max(self.last_end, end)
        return end

    def account(self, wi: int, wk: PromptBlocks, hit_tokens: int, ttft: float) -> None:
        r = self.result
        r.requests += 1
        r.prompt_tokens += wk.num_tokens
        r.hit_tokens += hit_tokens
        r.ttfts.append(ttft)
        r.per_worker[wi] += wk.num_tokens
        r.prefill_per_worker[wi] += wk.num_tokens - hit_tokens
        self.sent.append(wk)


def replay(
    sessions: Sequence[Session],
    arrivals: Sequence[float],
    policy_spec: dict[str, object],
    *,
    fleet: SimFleet = SimFleet(),
    replicas: int = 1,
    max_requests: int | None = None,
    seed: int = 0,
    recent_half_life_s: float = DEFAULT_HALF_LIFE_S,
    sync_lag_s: float = 0.05,
    first_token: bool = True,
) -> SimResult:
    """Replay ``sessions`` (starting at ``arrivals``) through ``replicas`` instances of the policy; each
    replica sees the others' routing ``sync_lag_s`` late; ``first_token``: each replica sees which of its
    requests still wait for their first token (``WorkerView.prefill_tokens``)."""
    sim = _Replay(policy_spec, fleet, replicas, seed, recent_half_life_s, sync_lag_s, first_token)
    events: list[tuple[float, int, int]] = [(at, i, 0) for i, at in enumerate(arrivals)]
    heapq.heapify(events)
    budget = max_requests if max_requests is not None else 1 << 62
    while events and budget > 0:
        at, si, turn = heapq.heappop(events)
        sim.now = at
        budget -= 1
        session = sessions[si]
        sim.catch_up(at)
        end = sim.serve(
            zlib.crc32(session.id.encode()) % replicas, session, sim.prompt(session.requests[turn])
        )
        if turn + 1 < len(session.requests):
            heapq.heappush(events, (end, si, turn + 1))
    result = sim.result
    span = sim.last_end - (min(arrivals) if arrivals else 0.0)
    result.prefill_capacity_tokens = fleet.prefill_tps * fleet.workers * span
    result.ideal_hit_rate = ideal_replay(
        sim.sent, fleet.workers * fleet.capacity_tokens, fleet.block_size
    ).hit_rate
    return result


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """The driver's open-loop session arrivals (``loadtest.driver``)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def window(sessions: Sequence[Session], start: int, count: int) -> tuple[list[Session], list[float]]:
    """``count`` open-loop sessions from index ``start``, with their arrivals rebased to the first one's."""
    part = list(sessions[start : start + count])
    t0 = (part[0].arrival_s or 0.0) if part else 0.0
    return part, [(s.arrival_s or 0.0) - t0 for s in part]


def spread_ties(arrivals: Sequence[float], step_s: float) -> list[float]:
    """Arrivals with each run of equal times spread ``step_s`` apart, in order (the trace's timestamps sit on
    a 3 s grid, so its bursts arrive in the same instant; live, a gateway takes them one after another)."""
    out: list[float] = []
    k = 0
    for i, at in enumerate(arrivals):
        k = k + 1 if i and at == arrivals[i - 1] else 0
        out.append(at + k * step_s)
    return out


def mean_row(results: Sequence[SimResult]) -> tuple[float, float, float, float, float, float, float]:
    """Means over seeds: hit/ideal, TTFT p50 and p99 (ms), imbalance, prefill imbalance, worst imbalance;
    then the p99 of all seeds' requests together (ms). A seed's own p99 is its few slowest requests (the 6th
    of 600), so one bad burst in one seed moves the mean of p99s by several ms; the pooled one is steadier."""
    n = len(results)
    pooled = SimResult(ttfts=[t for r in results for t in r.ttfts])
    return (
        sum(r.hit_rate / r.ideal_hit_rate for r in results) / n,
        sum(r.ttft_p(0.5) for r in results) * 1e3 / n,
        sum(r.ttft_p(0.99) for r in results) * 1e3 / n,
        sum(r.imbalance for r in results) / n,
        sum(r.prefill_imbalance for r in results) / n,
        max(r.imbalance for r in results),
        pooled.ttft_p(0.99) * 1e3,
    )


def _trace_sessions(limit: int, args: argparse.Namespace) -> list[Session]:
    """The trace's sessions at ``--trace-speedup`` (all of them when strided, else the first ``limit``)."""
    from loadtest.bench_routing import TRACE, TRACE_OPTIONS
    from loadtest.trace import trace_sessions

    opts = replace(TRACE_OPTIONS, speedup=args.trace_speedup or TRACE_OPTIONS.speedup)
    return trace_sessions(TRACE, opts if args.trace_stride > 0 else replace(opts, limit=limit))


def _seed_input(
    name: str, sessions: list[Session], rate: float | None, limit: int, seed: int, args: argparse.Namespace
) -> tuple[list[Session], list[float]]:
    """What seed ``seed`` replays: a stretch of the trace (``--trace-stride``), Poisson arrivals at ``rate``,
    or the sessions' own arrivals; then spread (``--arrival-spread-ms``)."""
    if name == "trace" and args.trace_stride > 0:
        sessions, arrivals = window(sessions, seed * args.trace_stride, limit)
    elif rate is not None:
        arrivals = poisson_arrivals(len(sessions), rate, seed)
    else:
        arrivals = [float(s.arrival_s or 0.0) for s in sessions]
    if args.arrival_spread_ms:
        arrivals = spread_ties(arrivals, args.arrival_spread_ms / 1000.0)
    return sessions, arrivals


def sim_fleet(sessions: list[Session], args: argparse.Namespace) -> tuple[list[Session], SimFleet]:
    """The sessions and the fleet to replay them on (``--fleet``, ``--prefill-tps``): on the foreign fleet,
    word prompts and each worker's cache and prefill rate scaled to the workload's words per kvgate token,
    as ``bench_routing --fleet foreign`` runs them."""
    fleet = SimFleet(prefill_tps=args.prefill_tps)
    if args.fleet != "foreign":
        return sessions, fleet
    words = as_words(sessions)
    scaled = WorkerFleet.scaled(
        fleet.capacity_tokens, fleet.prefill_tps, worker_tokens_per_token(sessions, words)
    )
    return words, replace(
        fleet, capacity_tokens=scaled.kv_tokens, prefill_tps=scaled.prefill_tps, block_size=WORD_BLOCK_SIZE,
        foreign=True, gateway_block_size=args.gateway_block_size,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    from loadtest.bench_routing import SCENARIOS

    ap = argparse.ArgumentParser(prog="python -m loadtest.route_sim", description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--policies", default="round_robin,least_load,prefix_cache_aware")
    ap.add_argument("--replicas", default="1,4")
    ap.add_argument("--pca-params", default="{}", help="prefix_cache_aware params as JSON")
    ap.add_argument("--seeds", type=int, default=1, help="repeat with this many seeds (policy RNG, arrivals)")
    ap.add_argument("--sync-lag-s", type=float, default=0.05, help="when replicas see each other's routing")
    ap.add_argument(
        "--arrival-spread-ms",
        type=float,
        default=0.0,
        help="spread requests that arrive in the same instant this far apart, in order (0: simultaneous)",
    )
    ap.add_argument(
        "--trace-speedup",
        type=float,
        default=0.0,
        help="replay the trace this many times faster than recorded (0: the live bench's speed-up)",
    )
    ap.add_argument(
        "--fleet",
        choices=["kvgate", "foreign"],
        default="kvgate",
        help="kvgate: the index sees the workers' caches (events); foreign: event-less word-token workers, "
        "placement guessed from routing in byte blocks (bench_routing --fleet foreign)",
    )
    ap.add_argument(
        "--no-first-token",
        action="store_true",
        help="the gateway does not see first tokens (no WorkerView.prefill_tokens: in-flight tokens only)",
    )
    ap.add_argument("--gateway-block-size", type=int, default=64, help="foreign: the gateway's byte block")
    ap.add_argument(
        "--prefill-tps",
        type=float,
        default=SimFleet().prefill_tps,
        help="each worker's prefill rate in tokens/s (lower it to load the fleet, as bench_routing's flag)",
    )
    ap.add_argument(
        "--trace-stride",
        type=int,
        default=0,
        help="seed k replays the trace from record k × this (0: every seed replays its first records)",
    )
    args = ap.parse_args(argv)
    params = json.loads(args.pca_params)
    print(
        "| scenario | policy | replicas | seed | hit rate | ideal | hit/ideal | TTFT p50 ms | p99 ms "
        "| imbalance | prefill imb | prefill util |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    means = []
    for name in args.scenarios.split(","):
        sc = SCENARIOS[name]
        sessions = _trace_sessions(sc.max_requests, args) if name == "trace" else sc.sessions(False)
        sessions, fleet = sim_fleet(sessions, args)
        by_case: dict[tuple[str, int], list[SimResult]] = {}
        for seed in range(args.seeds):
            seed_sessions, arrivals = _seed_input(name, sessions, sc.rate, sc.max_requests, seed, args)
            for pol in args.policies.split(","):
                spec: dict[str, object] = {"type": pol}
                if pol == "prefix_cache_aware" and params:
                    spec["params"] = params
                for n in (int(x) for x in args.replicas.split(",")):
                    if n > 1 and pol != "prefix_cache_aware":
                        continue
                    r = replay(
                        seed_sessions,
                        arrivals,
                        spec,
                        replicas=n,
                        max_requests=sc.max_requests,
                        seed=seed,
                        sync_lag_s=args.sync_lag_s,
                        fleet=fleet,
                        first_token=not args.no_first_token,
                    )
                    by_case.setdefault((pol, n), []).append(r)
                    print(
                        f"| {name} | {pol} | {n} | {seed} | {r.hit_rate:.1%} | {r.ideal_hit_rate:.1%} "
                        f"| {r.hit_rate / r.ideal_hit_rate:.2f} | {r.ttft_p(0.5) * 1e3:.1f} "
                        f"| {r.ttft_p(0.99) * 1e3:.1f} "
                        f"| {r.imbalance:.2f} | {r.prefill_imbalance:.2f} | {r.prefill_utilisation:.2f} |",
                        flush=True,
                    )
        means += [(name, pol, n, mean_row(rs)) for (pol, n), rs in by_case.items()]
    if args.seeds > 1:
        print(f"\nMeans over {args.seeds} seeds (worst imbalance; p99 of all seeds' requests together):\n")
        print(
            "| scenario | policy | replicas | hit/ideal | TTFT p50 ms | p99 ms | imbalance | prefill imb ",
            end="",
        )
        print("| worst | pooled p99 ms |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, pol, n, m in means:
            print(
                f"| {name} | {pol} | {n} | {m[0]:.3f} | {m[1]:.2f} | {m[2]:.1f} | {m[3]:.3f} | {m[4]:.3f} "
                f"| {m[5]:.2f} | {m[6]:.1f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

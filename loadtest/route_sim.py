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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gateway.settings import DEFAULT_HALF_LIFE_S
from gateway.state.memory import MemoryLoadBoard
from gateway.state.recent import RecentConfig
from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint
from loadtest.ideal_cache import PromptBlocks, ideal_replay, prompt_blocks
from loadtest.workloads import Session
from policies.api import Observer, Policy, PolicyContext, RouteRequest, WorkerId, WorkerView
from policies.placement import Placement, placement_of
from policies.registry import build_policy
from workers.engine.block_manager import BlockManager


@dataclass(frozen=True, slots=True)
class SimFleet:
    """The simulated fleet: worker count, cache size and timing (the ``bench_routing`` defaults)."""

    workers: int = 8
    capacity_tokens: int = 16_384
    block_size: int = 16
    prefill_tps: float = 20_000.0
    decode_tps: float = 100.0


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

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else float("nan")

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
    # (visible to other replicas from, end time, accounted tokens, replica that routed it)
    inflight: list[tuple[float, float, int, int]] = field(default_factory=list)


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
) -> SimResult:
    """Replay ``sessions`` (starting at ``arrivals``) through ``replicas`` instances of the policy; each
    replica sees the others' routing ``sync_lag_s`` late."""
    now = [0.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731 - the simulated clock
    policies: list[Policy] = [
        build_policy(
            policy_spec,
            PolicyContext(
                clock=clock,
                rng=random.Random(seed + i),
                block_size=fleet.block_size,
                replicas=lambda: replicas,
                replica_rank=lambda i=i: i,  # type: ignore[misc]
            ),
        )
        for i in range(replicas)
    ]
    workers = [
        _Worker(BlockManager(fleet.capacity_tokens // fleet.block_size, fleet.block_size))
        for _ in range(fleet.workers)
    ]
    ids = [WorkerId(f"w{i}") for i in range(fleet.workers)]
    # the gateway's own recent-load accounting, on simulated time
    boards = [MemoryLoadBoard(RecentConfig(recent_half_life_s), clock=clock) for _ in range(replicas)]
    # (visible at, replica, sequence number, worker, tokens, cached, placement); the sequence keeps the heap
    # from comparing placements
    late: list[tuple[float, int, int, WorkerId, int, int, Placement]] = []
    bundle = byte_bundle()
    result = SimResult(per_worker=[0] * fleet.workers, prefill_per_worker=[0] * fleet.workers)
    sent: list[PromptBlocks] = []
    events: list[tuple[float, int, int]] = [(at, i, 0) for i, at in enumerate(arrivals)]
    heapq.heapify(events)
    budget = max_requests if max_requests is not None else 1 << 62
    seq = 0
    while events and budget > 0:
        at, si, turn = heapq.heappop(events)
        now[0] = at
        session = sessions[si]
        req = session.requests[turn]
        blocks = prompt_blocks(req.body, Endpoint(req.endpoint), bundle, block_size=fleet.block_size)
        budget -= 1
        ri = zlib.crc32(session.id.encode()) % replicas
        while late and late[0][0] <= at:
            _, other, _, wid, tokens, cached, how = heapq.heappop(late)
            boards[other].add_routed(wid, tokens, cached, how)
        board = boards[ri]
        views = []
        for wid, w in zip(ids, workers, strict=True):
            w.inflight = [x for x in w.inflight if x[1] > at]
            seen = [tok for vis, _, tok, by in w.inflight if by == ri or vis <= at]
            hit = w.cache.num_cached_prefix_blocks(blocks.block_hashes, blocks.num_tokens)
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
                )
            )
        rreq = RouteRequest(
            model="m", num_prompt_tokens=blocks.num_tokens, block_hashes=blocks.block_hashes,
            session_id=session.id, max_tokens=blocks.output_tokens,
        )  # fmt: skip
        policy = policies[ri]
        decision = policy.select(rreq, views)
        assert decision.worker is not None
        if isinstance(policy, Observer):
            policy.on_routed(rreq, decision)
        wi = ids.index(decision.worker)
        w = workers[wi]
        cache = w.cache
        seq += 1
        name = f"r{seq}"
        if cache.blocks_for(blocks.num_tokens + blocks.output_tokens) > cache.num_total_blocks:
            hit_tokens = 0
        else:
            hit_tokens = (
                cache.allocate(name, blocks.num_tokens, blocks.block_hashes, root=0) * fleet.block_size
            )
            cache.append_slots(name, blocks.num_tokens + blocks.output_tokens)
            cache.commit(name, range(blocks.num_tokens))
            cache.free(name)
        uncached = blocks.num_tokens - hit_tokens
        start = max(at, w.prefill_free_at)
        first = start + uncached / fleet.prefill_tps
        w.prefill_free_at = first
        end = first + blocks.output_tokens / fleet.decode_tps
        w.inflight.append((at + sync_lag_s, end, uncached + blocks.output_tokens, ri))
        routed = blocks.num_tokens + blocks.output_tokens
        placement = placement_of(views, decision.worker)
        board.add_routed(decision.worker, routed, hit_tokens, placement)
        for other in range(replicas):
            if other != ri:
                shared = (at + sync_lag_s, other, seq, decision.worker, routed, hit_tokens, placement)
                heapq.heappush(late, shared)
        result.requests += 1
        result.prompt_tokens += blocks.num_tokens
        result.hit_tokens += hit_tokens
        result.ttfts.append(first - at)
        result.per_worker[wi] += blocks.num_tokens
        result.prefill_per_worker[wi] += uncached
        sent.append(blocks)
        if turn + 1 < len(session.requests):
            heapq.heappush(events, (end, si, turn + 1))
    result.ideal_hit_rate = ideal_replay(
        sent, fleet.workers * fleet.capacity_tokens, fleet.block_size
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
        "--trace-stride",
        type=int,
        default=0,
        help="seed k replays the trace from record k × this (0: every seed replays its first records)",
    )
    args = ap.parse_args(argv)
    params = json.loads(args.pca_params)
    print(
        "| scenario | policy | replicas | seed | hit rate | ideal | hit/ideal | TTFT p50 ms | p99 ms "
        "| imbalance | prefill imb |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    means = []
    for name in args.scenarios.split(","):
        sc = SCENARIOS[name]
        sessions = _trace_sessions(sc.max_requests, args) if name == "trace" else sc.sessions(False)
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
                    )
                    by_case.setdefault((pol, n), []).append(r)
                    print(
                        f"| {name} | {pol} | {n} | {seed} | {r.hit_rate:.1%} | {r.ideal_hit_rate:.1%} "
                        f"| {r.hit_rate / r.ideal_hit_rate:.2f} | {r.ttft_p(0.5) * 1e3:.1f} "
                        f"| {r.ttft_p(0.99) * 1e3:.1f} "
                        f"| {r.imbalance:.2f} | {r.prefill_imbalance:.2f} |",
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

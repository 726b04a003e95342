"""Per-request cost (µs) of each built-in policy's ``select`` at 4, 16 and 64 workers.

Run: ``python -m loadtest.bench_policies``.

Snapshots are realistic: 2k-token prompts (128 block hashes of 16 tokens), per-worker GPU and tier prefix
hits, loads, queue depths and a session id from a pool of 1,000. Each policy runs over pre-built
snapshots (building them is not timed) and, like the gateway's router, calls ``on_routed`` after each
``select`` for policies that keep state. The figure is the best of ``--repeats`` runs, in CPU µs per
request (process CPU time, steadier than wall time on a shared machine).

A last row, ``router (round_robin)``, is what the gateway's router adds around a policy: building the
snapshot from the fleet and the load board, then the bookkeeping of a decision and of its end
(``gateway.routing.router``: ``route`` + ``finished``, round robin's own ``select`` included, no tokenizer).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from gateway.fleet.registry import Fleet
from gateway.observability.metrics import Metrics
from gateway.routing.router import Router
from gateway.settings import BreakerSettings, WorkerSpec
from gateway.state.memory import MemoryLoadBoard
from policies import (
    Observer,
    Policy,
    PolicyContext,
    Role,
    RouteRequest,
    WorkerId,
    WorkerView,
    available_policies,
    build_policy,
    make_registry,
)

BLOCK_SIZE = 16
PIPELINE: dict[str, Any] = {
    "type": "pipeline",
    "filters": [{"type": "max_queue", "params": {"max_queue_depth": 32}}],
    "scorers": [
        {"type": "prefix_hit", "weight": 3},
        {"type": "queue_depth", "weight": 1},
        {"type": "inflight_tokens", "weight": 1},
    ],
    "picker": "max_score",
}
ROUTER_ROW = "router (round_robin)"


def snapshots(n_workers: int, count: int, seed: int, pd: bool) -> list[tuple[RouteRequest, list[WorkerView]]]:
    """``count`` (request, fleet) pairs; PD fleets get a third of prefill and a third of decode workers."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        blocks = 128
        req = RouteRequest(
            model="smollm2",
            num_prompt_tokens=blocks * BLOCK_SIZE + rng.randrange(BLOCK_SIZE),
            block_hashes=tuple(rng.getrandbits(64) for _ in range(blocks)),
            session_id=None if rng.random() < 0.2 else f"session-{rng.randrange(1000)}",
            headers={"content-type": "application/json"},
            max_tokens=256,
        )
        fleet = []
        for i in range(n_workers):
            gpu = rng.choice([0, 0, rng.randrange(blocks), blocks])
            role = (Role.PREFILL, Role.DECODE, Role.BOTH)[i % 3] if pd else Role.BOTH
            fleet.append(
                WorkerView(
                    id=WorkerId(f"http://10.0.0.{i}:9000"),
                    role=role,
                    healthy=rng.random() > 0.05,
                    inflight_requests=rng.randrange(32),
                    inflight_tokens=rng.randrange(60_000),
                    queue_depth=rng.randrange(16),
                    kv_usage=rng.random(),
                    gpu_hit_blocks=gpu,
                    tier_hit_blocks=rng.randrange(blocks - gpu + 1),
                )
            )
        out.append((req, fleet))
    return out


def time_policy(
    policy: Policy, snaps: Sequence[tuple[RouteRequest, list[WorkerView]]], repeats: int
) -> float:
    """Best-of-``repeats`` µs per ``select`` (plus ``on_routed`` for observers)."""
    observer = policy if isinstance(policy, Observer) else None
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time_ns()
        for req, fleet in snaps:
            decision = policy.select(req, fleet)
            if observer is not None:
                observer.on_routed(req, decision)
        best = min(best, (time.process_time_ns() - start) / len(snaps) / 1000.0)
    return best


def time_router(n_workers: int, count: int, repeats: int) -> float:
    """Best-of-``repeats`` µs per ``Router.route`` + ``Router.finished`` over ``n_workers`` (round robin)."""
    fleet = Fleet(breaker=BreakerSettings(), clock=time.monotonic)
    for i in range(n_workers):
        record = fleet.add(WorkerSpec(id=f"w{i}", url=f"http://10.0.0.{i}:9000"))
        record.healthy, record.models = True, frozenset({"smollm2"})
    policy = build_policy("round_robin", PolicyContext(rng=random.Random(0), block_size=BLOCK_SIZE))
    router = Router(fleet=fleet, load=MemoryLoadBoard(), policy=policy, analyzer=None, kv_index=None,
                    block_size=BLOCK_SIZE, metrics=Metrics())  # fmt: skip
    req = RouteRequest(model="smollm2", max_tokens=256)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time_ns()
        for _ in range(count):
            router.finished(router.route(req), ok=True, cached_tokens=None, latency_s=0.01)
        best = min(best, (time.process_time_ns() - start) / count / 1000.0)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_policies", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--requests", type=int, default=2000, help="snapshots per size")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    registry = make_registry([])
    names = [n for n in available_policies(registry) if n != "pipeline"] + ["pipeline (3 scorers)"]
    table: dict[str, list[float]] = {n: [] for n in [*names, ROUTER_ROW]}
    for size in args.sizes:
        plain = snapshots(size, args.requests, seed=size, pd=False)
        mixed = snapshots(size, args.requests, seed=size, pd=True)
        for name in names:
            spec: Any = PIPELINE if name.startswith("pipeline") else name
            policy = build_policy(spec, PolicyContext(rng=random.Random(0), block_size=BLOCK_SIZE), registry)
            snaps = mixed if name == "pd_disaggregation" else plain
            table[name].append(time_policy(policy, snaps, args.repeats))
        table[ROUTER_ROW].append(time_router(size, args.requests, args.repeats))
    names.append(ROUTER_ROW)
    width = max(len(n) for n in names)
    print(
        f"{'policy':<{width}} "
        + " ".join(f"{f'{s} workers':>12}" for s in args.sizes)
        + "   (CPU µs/request)"
    )
    for name in names:
        print(f"{name:<{width}} " + " ".join(f"{v:>12.1f}" for v in table[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fault and abuse scenarios against a real fleet on loopback, bounded in count and time.

``python -m loadtest.faults`` runs them all and prints, per scenario, the requests sent and how they
ended; the integration tests run the same functions with smaller sizes and assert on the outcome.
Scenarios: a worker killed under load (streaming and not), Redis killed and restarted under two gateway
replicas, a slow worker (timeouts and breaker move traffic away), thousands of idle connections, and
malformed or oversized bodies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loadtest.driver import DriverConfig, RunResult, run_load
from loadtest.fleet import Fleet, FleetSpec, kill_process, launch, restart_redis
from loadtest.workloads import Session, WorkloadSpec, build_workload


@dataclass(frozen=True, slots=True)
class FaultReport:
    """How the requests of one scenario ended."""

    name: str
    sent: int
    ok: int
    failed: int
    cut_streams: int = 0
    by_worker: dict[str, int] = field(default_factory=dict)
    notes: str = ""
    #: requests the deliberately slow worker completed (slow-worker scenario only)
    slow_served: int | None = None


@dataclass(frozen=True, slots=True)
class FaultConfig:
    duration_s: float = 8.0
    concurrency: int = 16
    log_dir: Path = Path("loadtest-results/faults")
    worker_args: tuple[str, ...] = ("--decode-tps", "200", "--prefill-tps", "20000")


def _report(name: str, result: RunResult, notes: str = "") -> FaultReport:
    recs = result.records
    cut = [r for r in recs if r.error and r.status == 200]  # stream ended by an error event
    failed = [r for r in recs if r.error and r.status != 200]
    return FaultReport(
        name=name,
        sent=len(recs),
        ok=sum(r.ok for r in recs),
        failed=len(failed),
        cut_streams=len(cut),
        by_worker=dict(Counter(r.worker or "-" for r in recs if r.ok)),
        notes=notes,
    )


def _sessions(n: int, max_tokens: int = 24, prefix_words: int = 200) -> list[Session]:
    spec = WorkloadSpec(num_sessions=n, turns=2, max_tokens=max_tokens, prefix_words=prefix_words)
    return build_workload("shared_prefix", spec)


async def _load_with_fault(
    fleet: Fleet, cfg: FaultConfig, stream: bool, fault: Callable[[], Awaitable[None]]
) -> RunResult:
    driver = DriverConfig(
        target=",".join(fleet.gateway_urls),
        stream=stream,
        concurrency=cfg.concurrency,
        duration_s=cfg.duration_s,
        request_timeout_s=30,
    )
    sessions = _sessions(4000)
    load = asyncio.create_task(run_load(sessions, driver))
    await fault()
    return await load


async def worker_killed(cfg: FaultConfig, stream: bool) -> FaultReport:
    """SIGKILL one of three workers a third of the way in."""
    spec = FleetSpec(
        workers=3,
        policy="least_load",
        worker_args=cfg.worker_args,
        log_dir=cfg.log_dir / f"worker_killed_{stream}",
    )
    with launch(spec) as fleet:

        async def fault() -> None:
            await asyncio.sleep(cfg.duration_s / 3)
            await asyncio.to_thread(kill_process, fleet.worker_procs[0])

        result = await _load_with_fault(fleet, cfg, stream, fault)
    return _report(f"worker killed ({'streaming' if stream else 'non-streaming'})", result)


async def redis_restarted(cfg: FaultConfig) -> FaultReport:
    """Two gateways on one Redis; Redis is killed at 1/4 and started again at 1/2 of the run."""
    spec = FleetSpec(
        workers=3,
        gateways=2,
        policy="prefix_cache_aware",
        worker_args=cfg.worker_args,
        log_dir=cfg.log_dir / "redis_restarted",
    )
    with launch(spec) as fleet:

        async def fault() -> None:
            await asyncio.sleep(cfg.duration_s / 4)
            assert fleet.redis_proc is not None, "a two-gateway fleet has a private redis-server"
            await asyncio.to_thread(kill_process, fleet.redis_proc)
            await asyncio.sleep(cfg.duration_s / 4)
            await asyncio.to_thread(restart_redis, fleet, spec.log_dir / "redis.log")

        result = await _load_with_fault(fleet, cfg, True, fault)
    return _report("redis killed and restarted", result)


async def slow_worker(cfg: FaultConfig) -> FaultReport:
    """One worker takes ~10 s to its first token; the gateway's TTFB timeout moves its requests away."""
    spec = FleetSpec(
        workers=3,
        policy="round_robin",
        worker_args=cfg.worker_args,
        per_worker_args=(("--prefill-tps", "30"),),
        gateway_args=("--ttfb-timeout-s", "1.0"),
        log_dir=cfg.log_dir / "slow_worker",
    )
    with launch(spec) as fleet:
        result = await _load_with_fault(fleet, cfg, True, _noop)
        slow_id = fleet.worker_urls[0].removeprefix("http://")  # the gateway's default id is HOST:PORT
    report = _report("slow worker", result, notes=f"worker {slow_id} prefills at 30 tokens/s")
    return FaultReport(
        report.name,
        report.sent,
        report.ok,
        report.failed,
        report.cut_streams,
        report.by_worker,
        report.notes,
        slow_served=report.by_worker.get(slow_id, 0),
    )


def _raise_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, wanted))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def idle_connections(cfg: FaultConfig, count: int = 2000) -> FaultReport:
    """Hold ``count`` idle TCP connections open on the gateway while normal traffic runs."""
    limit = _raise_fd_limit(count * 2 + 512)  # the fleet inherits the raised limit
    count = min(count, max(0, limit // 2 - 256))
    spec = FleetSpec(
        workers=2, policy="least_load", worker_args=cfg.worker_args, log_dir=cfg.log_dir / "idle_connections"
    )
    with launch(spec) as fleet:
        host, port = fleet.gateway_urls[0].removeprefix("http://").split(":")
        socks: list[socket.socket] = []
        try:
            socks.extend(socket.create_connection((host, int(port)), timeout=5) for _ in range(count))
            result = await _load_with_fault(fleet, cfg, False, _noop)
        finally:
            for s in socks:
                s.close()
    return _report("idle connections", result, notes=f"{count} idle connections held")


async def _noop() -> None:
    return None


BAD_BODIES: tuple[tuple[str, bytes, str], ...] = (
    ("malformed json", b'{"model": "kvgate-sim", "messages": [', "application/json"),
    ("not an object", b"[1, 2, 3]", "application/json"),
    ("missing messages", b'{"model": "kvgate-sim"}', "application/json"),
    ("messages not a list", b'{"model": "kvgate-sim", "messages": "hi"}', "application/json"),
    (
        "negative max_tokens",
        b'{"model": "kvgate-sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
        "application/json",
    ),
    (
        "absurd max_tokens",
        b'{"model": "kvgate-sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10000000000}',
        "application/json",
    ),
    ("wrong content type", b"model=kvgate-sim", "application/x-www-form-urlencoded"),
    (
        "oversized",
        b'{"model": "kvgate-sim", "messages": [{"role": "user", "content": "' + b"a" * (64 << 20) + b'"}]}',
        "application/json",
    ),
    ("binary garbage", bytes(range(256)) * 16, "application/json"),
)


async def bad_bodies(cfg: FaultConfig) -> FaultReport:
    """Every malformed or oversized body gets a 4xx in OpenAI's error shape, never a 5xx."""
    spec = FleetSpec(
        workers=1, policy="round_robin", worker_args=cfg.worker_args, log_dir=cfg.log_dir / "bad"
    )
    statuses: Counter[str] = Counter()
    failed = 0
    with launch(spec) as fleet:
        async with httpx.AsyncClient(base_url=fleet.gateway_urls[0], timeout=30) as client:
            for name, body, ctype in BAD_BODIES:
                r = await client.post("/v1/chat/completions", content=body, headers={"content-type": ctype})
                statuses[f"{name}: {r.status_code}"] += 1
                shaped = (
                    r.headers.get("content-type", "").startswith("application/json") and "error" in r.json()
                )
                failed += int(r.status_code >= 500 or r.status_code < 400 or not shaped)
    return FaultReport(
        "bad bodies",
        sent=len(BAD_BODIES),
        ok=len(BAD_BODIES) - failed,
        failed=failed,
        notes="; ".join(statuses),
    )


def _print(reports: list[FaultReport]) -> None:
    print("| scenario | sent | ok | failed | streams cut with an error event | served by | notes |")
    print("|---|---|---|---|---|---|---|")
    for r in reports:
        workers = ", ".join(f"{k}: {v}" for k, v in sorted(r.by_worker.items()))
        print(f"| {r.name} | {r.sent} | {r.ok} | {r.failed} | {r.cut_streams} | {workers} | {r.notes} |")


async def _main(cfg: FaultConfig) -> list[FaultReport]:
    return [
        await worker_killed(cfg, stream=False),
        await worker_killed(cfg, stream=True),
        await redis_restarted(cfg),
        await slow_worker(cfg),
        await idle_connections(cfg),
        await bad_bodies(cfg),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    reports = asyncio.run(_main(FaultConfig(duration_s=args.duration, concurrency=args.concurrency)))
    _print(reports)
    return 0 if all(r.failed == 0 for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())

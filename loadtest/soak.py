"""Soak: steady mixed load through one gateway (Redis state) while workers and Redis restart on a schedule.

``python -m loadtest.soak --minutes 30`` starts a private ``redis-server``, 3 sim workers and one gateway
(``--state redis://…``) on loopback, sends a bounded request rate (chat and completions, streaming and not,
a bounded set of prompts so the KV index fills during warm-up), SIGKILLs and restarts one worker every
2 minutes and Redis every 5 (compressed for short runs: see ``soak_model.default_periods``), and prints per
interval the gateway's RSS, open fds and event-loop lag (``kvgate_event_loop_lag_seconds``) and how the
requests ended. The summary gives RSS and fds growth after warm-up and the requests lost. ``run_soak`` is
the same run as a function (``tests/integration/test_soak.py`` runs a one-minute version).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import orjson

from loadtest.fleet import Fleet, FleetSpec, launch
from loadtest.outcomes import Kind, Outcome
from loadtest.proc_stats import Histogram, lag_between, parse_histogram, sample
from loadtest.rawhttp import Call, Target, send
from loadtest.restarts import RedisProcess, restart_worker
from loadtest.soak_model import (
    HEADER,
    Counts,
    IntervalRow,
    Restart,
    SoakResult,
    default_periods,
    format_row,
    format_summary,
    restart_schedule,
    summarize,
)

_PREFIX = "You are a careful assistant for a logistics company. Answer briefly and cite the policy. " * 3


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak. Restart periods of None take ``default_periods(duration_s)``; 0 turns a kind off."""

    duration_s: float = 180.0
    interval_s: float = 60.0
    workers: int = 3
    rate: float = 20.0
    worker_restart_s: float | None = None
    redis_restart_s: float | None = None
    down_s: float = 1.0
    max_tokens: int = 32
    prompts: int = 32
    request_timeout_s: float = 30.0
    policy: str = "prefix_cache_aware"
    worker_args: tuple[str, ...] = ("--decode-tps", "40", "--prefill-tps", "20000")
    gateway_args: tuple[str, ...] = ()
    sample_s: float = 0.5
    log_dir: Path = Path("loadtest-results/soak")
    echo: bool = True

    def schedule(self) -> list[Restart]:
        worker_s, redis_s = default_periods(self.duration_s)
        return restart_schedule(
            self.duration_s,
            worker_s if self.worker_restart_s is None else self.worker_restart_s,
            redis_s if self.redis_restart_s is None else self.redis_restart_s,
            self.workers,
            quiet_tail_s=min(10.0, self.duration_s * 0.15),
        )


def soak_call(n: int, cfg: SoakConfig) -> Call:
    """Request ``n`` of the mix: chat stream, completions stream, chat, completions, in turn."""
    chat, stream = n % 2 == 0, n % 4 < 2
    prompt = f"{_PREFIX}Question {n % cfg.prompts}: where is parcel {n % cfg.prompts}?"
    body: dict[str, object] = {
        "model": "kvgate-sim",
        "max_tokens": cfg.max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return Call("/v1/chat/completions" if chat else "/v1/completions", orjson.dumps(body), stream)


@dataclass(slots=True)
class _Run:
    """What the load, restart and monitor tasks share (one event loop)."""

    t0: float
    interval: Counts = field(default_factory=Counts)
    totals: Counts = field(default_factory=Counts)
    failures: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    rows: list[IntervalRow] = field(default_factory=list)

    def record(self, task: asyncio.Task[Outcome]) -> None:
        out = Outcome(Kind.FAILED, detail="cancelled") if task.cancelled() else task.result()
        self.interval.add(out)
        self.totals.add(out)
        if out.kind is Kind.FAILED and len(self.failures) < 50:
            self.failures.append(f"{time.monotonic() - self.t0:.1f}s: {out.detail}")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


async def _load(target: Target, cfg: SoakConfig, run: _Run) -> None:
    """Open loop at ``cfg.rate`` until ``duration_s``, then wait for what is in flight (bounded)."""
    inflight: set[asyncio.Task[Outcome]] = set()
    n = 0
    while (at := n / cfg.rate) < cfg.duration_s:
        await asyncio.sleep(max(0.0, at - run.elapsed()))
        task = asyncio.create_task(send(target, soak_call(n, cfg), timeout_s=cfg.request_timeout_s))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        task.add_done_callback(run.record)
        n += 1
    if inflight:
        await asyncio.wait(inflight)


def _label(ev: Restart) -> str:
    return f"worker {ev.index}" if ev.what == "worker" else "redis"


async def _restarts(fleet: Fleet, redis: RedisProcess, cfg: SoakConfig, run: _Run) -> None:
    for ev in cfg.schedule():
        await asyncio.sleep(max(0.0, ev.at_s - run.elapsed()))
        if ev.what == "worker":
            log = cfg.log_dir / f"worker-{ev.index}.log"
            healthy = await asyncio.to_thread(restart_worker, fleet, ev.index, log, cfg.down_s)
            label = _label(ev) + ("" if healthy else " (not healthy again!)")
        else:
            await asyncio.to_thread(redis.kill)
            await asyncio.sleep(cfg.down_s)
            await asyncio.to_thread(redis.start)
            label = "redis"
        run.events.append(label)
        run.restarts.append(f"{label} at {ev.at_s:.0f}s")


async def _scrape(http: httpx.AsyncClient) -> Histogram:
    try:
        return parse_histogram((await http.get("/metrics")).text)
    except httpx.HTTPError:
        return Histogram()


async def _monitor(pid: int, http: httpx.AsyncClient, cfg: SoakConfig, run: _Run) -> None:
    """Sample RSS and fds every ``sample_s``; close a row at every interval boundary and at the end."""
    hist = await _scrape(http)
    boundary = min(cfg.interval_s, cfg.duration_s)
    fds: list[int] = []
    rss = 0
    while True:
        await asyncio.sleep(min(cfg.sample_s, max(0.0, boundary - run.elapsed())))
        if (s := sample(pid)) is not None:
            fds.append(s.fds)
            rss = s.rss_bytes
        if run.elapsed() < boundary:
            continue
        new = await _scrape(http)
        row = IntervalRow(
            boundary,
            rss,
            min(fds, default=0),
            max(fds, default=0),
            lag_between(hist, new),
            run.interval,
            tuple(run.events),
        )
        run.rows.append(row)
        if cfg.echo:
            print(format_row(row), flush=True)
        hist, fds, run.interval, run.events = new, [], Counts(), []
        if boundary >= cfg.duration_s:
            return
        boundary = min(boundary + cfg.interval_s, cfg.duration_s)


async def _drive(fleet: Fleet, redis: RedisProcess, cfg: SoakConfig) -> SoakResult:
    run = _Run(t0=time.monotonic())
    gateway = fleet.gateway_urls[0]
    if cfg.echo:
        print(HEADER, flush=True)
    async with httpx.AsyncClient(base_url=gateway, timeout=5.0) as http, asyncio.TaskGroup() as tg:
        tg.create_task(_load(Target.from_url(gateway), cfg, run))
        tg.create_task(_restarts(fleet, redis, cfg, run))
        tg.create_task(_monitor(fleet.gateway_procs[0].pid, http, cfg, run))
    return summarize(run.rows, run.totals, run.restarts, run.failures)


def run_soak(cfg: SoakConfig) -> SoakResult:
    """Start Redis and the fleet, soak for ``cfg.duration_s``, stop everything; the result."""
    redis = RedisProcess(cfg.log_dir / "redis.log")
    redis.start()
    try:
        spec = FleetSpec(
            workers=cfg.workers,
            policy=cfg.policy,
            worker_args=("--max-running", "256", *cfg.worker_args),
            gateway_args=("--state", redis.url, *cfg.gateway_args),  # the last --state wins
            log_dir=cfg.log_dir,
        )
        with launch(spec) as fleet:
            return asyncio.run(_drive(fleet, redis, cfg))
    finally:
        redis.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="run length (default 3)")
    parser.add_argument("--interval-s", type=float, default=60.0, help="seconds per printed row")
    parser.add_argument("--workers", type=int, default=3, help="sim workers (2-4)")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second (default 20)")
    parser.add_argument("--worker-restart-s", type=float, default=None, help="period (0: off)")
    parser.add_argument("--redis-restart-s", type=float, default=None, help="period (0: off)")
    parser.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag, repeatable")
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    cfg = SoakConfig(
        duration_s=args.minutes * 60,
        interval_s=args.interval_s,
        workers=args.workers,
        rate=args.rate,
        worker_restart_s=args.worker_restart_s,
        redis_restart_s=args.redis_restart_s,
        gateway_args=tuple(args.gateway_arg),
    )
    plan = ", ".join(_label(e) + f" at {e.at_s:.0f}s" for e in cfg.schedule()) or "none"
    print(f"soak: {cfg.duration_s:.0f}s, {cfg.workers} sim workers, {cfg.rate:g} req/s; restarts: {plan}")
    result = run_soak(cfg)
    print(format_summary(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(asdict(result), indent=1, default=str))
    return 0 if result.lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

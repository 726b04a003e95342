"""Concurrency benchmark: N streams opened at once (a burst) and ramped, through one gateway to sim workers.

``python -m loadtest.bench_concurrency --streams 1000,4000,10000`` starts one gateway and ``--workers`` sim
workers on loopback (``loadtest.fleet``), then per step opens N streaming chat completions of ``--chunks``
tokens each from this one process (raw asyncio streams, one connection per stream; the soft open-files limit
raised to the hard one after the fleet started, so the gateway runs with the limit it was given) and prints:

- ok / shed (503 with ``Retry-After`` and OpenAI's error shape) / failed (anything else: 502, connection
  errors, a stream without ``data: [DONE]`` or ended by an error event), with the commonest failure reasons;
- the gateway's RSS and open fds idle (before), at peak and after (``/proc``), and RSS per open stream
  ((peak - idle) / most streams open at once);
- time to the response's first byte (p50 / p99) of the streams answered.

Bounded: every stream has a deadline, the whole run ``--timeout-s``; steps past it are skipped. RSS per
stream is the figure of a burst: the gateway keeps the memory it freed, so a step after a larger one (a
ramp after its burst) seldom raises the peak and reads near 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from loadtest.fleet import FleetSpec, launch
from loadtest.outcomes import Kind, Outcome
from loadtest.proc_stats import ProcSample, raise_nofile_limit, sample
from loadtest.rawhttp import Call, OpenGauge, Target, send

DEFAULT_STREAMS = (250, 1000)
_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+(:\d+)?")
_LONG_NUMBER = re.compile(r"\d{4,}")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One benchmark run; ``max_running`` None gives every worker room for its share of the largest step."""

    streams: tuple[int, ...] = DEFAULT_STREAMS
    modes: tuple[str, ...] = ("burst", "ramp")
    workers: int = 4
    chunks: int = 64
    max_running: int | None = None
    decode_tps: float = 20.0
    ramp_s: float = 10.0
    policy: str = "prefix_cache_aware"
    gateway_args: tuple[str, ...] = ()
    timeout_s: float = 300.0
    request_timeout_s: float = 120.0
    settle_s: float = 3.0
    log_dir: Path = Path("loadtest-results/bench_concurrency")

    def slots(self) -> int:
        return self.max_running or max(1, math.ceil(max(self.streams) / self.workers))


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step: N streams in one mode, how they ended and what the gateway process held."""

    streams: int
    mode: str
    ok: int
    shed: int
    failed: int
    wall_s: float
    open_peak: int
    rss_idle: int
    rss_peak: int
    rss_after: int
    fds_idle: int
    fds_peak: int
    fds_after: int
    ttfb_p50_s: float | None
    ttfb_p99_s: float | None
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def rss_per_stream(self) -> float:
        return (self.rss_peak - self.rss_idle) / max(1, self.open_peak)


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def stream_call(i: int, chunks: int) -> Call:
    """Stream ``i``: a chat completion of exactly ``chunks`` tokens."""
    body = {
        "model": "kvgate-sim",
        "messages": [{"role": "user", "content": f"Stream {i}: count slowly."}],
        "max_tokens": chunks,
        "ignore_eos": True,
        "stream": True,
    }
    return Call("/v1/chat/completions", orjson.dumps(body), stream=True)


def failure_reason(detail: str) -> str:
    """A failure's reason without what makes every one unique (addresses, ports, long numbers)."""
    return _LONG_NUMBER.sub("#", _ADDRESS.sub("ADDR", detail))[:160]


@dataclass(slots=True)
class _Peaks:
    rss: int = 0
    fds: int = 0


async def _watch(pid: int, peaks: _Peaks, stop: asyncio.Event, every_s: float = 0.2) -> None:
    while not stop.is_set():
        if (s := sample(pid)) is not None:
            peaks.rss, peaks.fds = max(peaks.rss, s.rss_bytes), max(peaks.fds, s.fds)
        await asyncio.sleep(every_s)


async def _open_streams(
    target: Target, n: int, mode: str, cfg: BenchConfig, gauge: OpenGauge, timeout_s: float
) -> list[Outcome]:
    """Burst: all ``n`` started at once; ramp: started evenly over ``cfg.ramp_s``."""
    if mode == "burst":
        calls = (send(target, stream_call(i, cfg.chunks), timeout_s=timeout_s, gauge=gauge) for i in range(n))
        return list(await asyncio.gather(*calls))
    tasks: list[asyncio.Task[Outcome]] = []
    t0 = time.perf_counter()
    for i in range(n):
        await asyncio.sleep(max(0.0, t0 + i * cfg.ramp_s / n - time.perf_counter()))
        call = stream_call(i, cfg.chunks)
        tasks.append(asyncio.create_task(send(target, call, timeout_s=timeout_s, gauge=gauge)))
    return list(await asyncio.gather(*tasks))


async def run_step(
    target: Target, pid: int, n: int, mode: str, cfg: BenchConfig, deadline: float
) -> StepResult:
    """Open ``n`` streams in ``mode`` against the gateway at ``target`` (process ``pid``) and measure."""
    idle = sample(pid) or ProcSample(0, 0)
    peaks, gauge, stop = _Peaks(idle.rss_bytes, idle.fds), OpenGauge(), asyncio.Event()
    watcher = asyncio.create_task(_watch(pid, peaks, stop))
    t0 = time.perf_counter()
    timeout_s = max(1.0, min(cfg.request_timeout_s, deadline - time.monotonic()))
    outcomes = await _open_streams(target, n, mode, cfg, gauge, timeout_s)
    wall_s = time.perf_counter() - t0
    stop.set()
    await watcher
    await asyncio.sleep(cfg.settle_s)
    after = sample(pid) or ProcSample(0, 0)
    kinds = Counter(o.kind for o in outcomes)
    ttfb = [o.ttfb_s for o in outcomes if o.kind is Kind.OK and o.ttfb_s is not None]
    reasons = Counter(failure_reason(o.detail) for o in outcomes if o.kind in (Kind.FAILED, Kind.CUT))
    return StepResult(
        streams=n, mode=mode, ok=kinds[Kind.OK], shed=kinds[Kind.SHED],
        failed=kinds[Kind.FAILED] + kinds[Kind.CUT], wall_s=wall_s, open_peak=gauge.peak,
        rss_idle=idle.rss_bytes, rss_peak=peaks.rss, rss_after=after.rss_bytes,
        fds_idle=idle.fds, fds_peak=peaks.fds, fds_after=after.fds,
        ttfb_p50_s=quantile(ttfb, 0.5), ttfb_p99_s=quantile(ttfb, 0.99),
        failures=dict(reasons.most_common(5)),
    )  # fmt: skip


HEADER = (
    "| streams | mode | ok | shed | failed | open peak | gw RSS MiB idle / peak / after "
    "| KiB per open stream | gw fds idle / peak / after | TTFB p50 / p99 ms | wall s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def format_step(r: StepResult) -> str:
    """One markdown row."""
    mib = [f"{v / 2**20:.0f}" for v in (r.rss_idle, r.rss_peak, r.rss_after)]
    ttfb = " / ".join("-" if v is None else f"{v * 1e3:.0f}" for v in (r.ttfb_p50_s, r.ttfb_p99_s))
    return (
        f"| {r.streams} | {r.mode} | {r.ok} | {r.shed} | {r.failed} | {r.open_peak} | {' / '.join(mib)} | "
        f"{r.rss_per_stream / 1024:.1f} | {r.fds_idle} / {r.fds_peak} / {r.fds_after} | {ttfb} | "
        f"{r.wall_s:.1f} |"
    )


async def _steps(gateway_url: str, pid: int, cfg: BenchConfig, started: float) -> list[StepResult]:
    target, results = Target.from_url(gateway_url), []
    deadline = started + cfg.timeout_s
    for n in cfg.streams:
        for mode in cfg.modes:
            if time.monotonic() > deadline - 5:
                print(f"skipped: {n} {mode} (past --timeout-s)", flush=True)
                continue
            result = await run_step(target, pid, n, mode, cfg, deadline)
            results.append(result)
            print(format_step(result), flush=True)
            for reason, count in result.failures.items():
                print(f"    failed {count}x: {reason}", flush=True)
            if sample(pid) is None:
                print("the gateway exited: no further steps", flush=True)
                return results
    return results


def run_bench(cfg: BenchConfig) -> list[StepResult]:
    """Start the fleet, run every step, stop the fleet; the results."""
    import uvloop

    started = time.monotonic()
    spec = FleetSpec(
        workers=cfg.workers,
        policy=cfg.policy,
        worker_args=("--max-running", str(cfg.slots()), "--decode-tps", str(cfg.decode_tps)),
        gateway_args=cfg.gateway_args,
        log_dir=cfg.log_dir,
    )
    with launch(spec) as fleet:
        limit = raise_nofile_limit()
        print(f"client open-files limit {limit}; gateway pid {fleet.gateway_procs[0].pid}", flush=True)
        print(HEADER, flush=True)
        return uvloop.run(_steps(fleet.gateway_urls[0], fleet.gateway_procs[0].pid, cfg, started))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_concurrency", description=__doc__.splitlines()[0]
    )
    a = parser.add_argument
    a("--streams", type=_ints, default=DEFAULT_STREAMS, help="steps, e.g. 1000,4000,10000")
    a("--modes", default="burst,ramp", help="burst, ramp or both (default burst,ramp)")
    a("--workers", type=int, default=4, help="sim workers (default 4)")
    a("--chunks", type=int, default=64, help="tokens (chunks) per stream (default 64)")
    a("--max-running", type=int, default=None, help="sim running slots per worker (default: enough)")
    a("--decode-tps", type=float, default=20.0, help="sim tokens/s per stream (default 20)")
    a("--ramp-s", type=float, default=10.0, help="seconds over which a ramp opens its streams")
    a("--policy", default="prefix_cache_aware", help="gateway routing policy")
    a("--gateway-arg", action="append", default=[], help="extra gateway flag, repeatable")
    a("--timeout-s", type=float, default=300.0, help="bound on the whole run (default 300)")
    a("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    cfg = BenchConfig(
        streams=args.streams, modes=tuple(m.strip() for m in args.modes.split(",")), workers=args.workers,
        chunks=args.chunks, max_running=args.max_running, decode_tps=args.decode_tps, ramp_s=args.ramp_s,
        policy=args.policy, gateway_args=tuple(args.gateway_arg), timeout_s=args.timeout_s,
    )  # fmt: skip
    print(f"{cfg.workers} sim workers x {cfg.slots()} running slots, {cfg.chunks} chunks per stream at "
          f"{cfg.decode_tps:g} tokens/s, gateway args {list(cfg.gateway_args)}", flush=True)  # fmt: skip
    results = run_bench(cfg)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        rows = [{**asdict(r), "rss_per_stream": r.rss_per_stream} for r in results]
        args.out.write_text(json.dumps({"config": asdict(cfg), "steps": rows}, indent=1, default=str))
    return 0 if all(r.failed == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

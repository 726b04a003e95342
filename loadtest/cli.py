"""``kvgate loadtest run|fleet|compare``: drive a target, launch a fleet, or compare policies/routers."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

from loadtest.driver import DriverConfig, RunResult, run_load
from loadtest.fleet import FleetSpec, launch
from loadtest.report import markdown_table, summarize, write_report
from loadtest.trace import TraceOptions, trace_sessions
from loadtest.workloads import Session, WorkloadSpec, build_workload


def _workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--workload",
        default="multi_turn",
        help="multi_turn|shared_prefix|long_doc_qa|agentic|unique|trace:FILE.jsonl",
    )
    g.add_argument("--model", default="kvgate-sim")
    g.add_argument("--sessions", type=int, default=16, help="users / groups / customers / agents")
    g.add_argument("--turns", type=int, default=4, help="turns per user, questions per group or customer")
    g.add_argument("--max-tokens", type=int, default=16)
    g.add_argument("--system-words", type=int, default=300)
    g.add_argument("--prefix-words", type=int, default=1500)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--trace-speedup", type=float, default=1.0, help="trace replay: time compression factor")
    g.add_argument("--trace-scale", type=int, default=1, help="trace replay: divide every length by this")
    g.add_argument("--trace-vocab", type=int, default=250, help="trace replay: token ids drawn from [0, N)")


def _driver_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("driver")
    g.add_argument("--duration", type=float, default=60.0, help="wall-clock bound in seconds")
    g.add_argument("--requests", type=int, default=None, help="request-count bound")
    g.add_argument("--concurrency", type=int, default=8, help="closed loop: sessions in flight")
    g.add_argument("--rate", type=float, default=None, help="open loop: Poisson session arrivals per second")
    g.add_argument("--no-stream", action="store_true", help="non-streaming requests")
    g.add_argument("--out", type=Path, default=Path("loadtest-results/run"))
    g.add_argument("--progress", action="store_true", help="show a progress bar")


def _fleet_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fleet")
    g.add_argument("--workers", type=int, default=4)
    g.add_argument("--gateways", type=int, default=1)
    g.add_argument("--policy", default="prefix_cache_aware")
    g.add_argument("--real", action="store_true", help="real CPU workers instead of simulated ones")
    g.add_argument("--model-path", default="tiny", help="with --real: the worker's --model")
    g.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeatable)")
    g.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag (repeatable)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="loadtest_command", required=True)
    run = sub.add_parser("run", help="drive a running target and write a report")
    run.add_argument("--target", required=True, help="gateway URL (comma-separate several)")
    _workload_args(run)
    _driver_args(run)
    fleet = sub.add_parser("fleet", help="start workers and gateways on loopback until Ctrl-C")
    _fleet_args(fleet)
    fleet.add_argument("--hold", type=float, default=None, help="stop after this many seconds")
    cmp_ = sub.add_parser("compare", help="run one workload against several policies or routers side by side")
    _fleet_args(cmp_)
    cmp_.add_argument("--policies", default="round_robin,least_load,prefix_cache_aware")
    cmp_.add_argument(
        "--router-cmd",
        action="append",
        default=[],
        help="NAME=COMMAND with {port} and {workers}/{workers_csv} placeholders (repeatable)",
    )
    cmp_.add_argument(
        "--gateway-counts", default=None, help="e.g. 1,4: run each policy with these replica counts"
    )
    _workload_args(cmp_)
    _driver_args(cmp_)


def build_sessions(args: argparse.Namespace) -> list[Session]:
    if args.workload.startswith("trace:"):
        opts = TraceOptions(
            model=args.model,
            speedup=args.trace_speedup,
            scale=args.trace_scale,
            vocab_size=args.trace_vocab,
            max_output_tokens=args.max_tokens,
            limit=args.requests,
        )
        return trace_sessions(args.workload.removeprefix("trace:"), opts)
    spec = WorkloadSpec(
        model=args.model,
        seed=args.seed,
        num_sessions=args.sessions,
        turns=args.turns,
        system_words=args.system_words,
        prefix_words=args.prefix_words,
        max_tokens=args.max_tokens,
    )
    return build_workload(args.workload, spec)


def _driver_config(args: argparse.Namespace, target: str) -> DriverConfig:
    return DriverConfig(
        target=target,
        stream=not args.no_stream,
        concurrency=args.concurrency,
        rate=args.rate,
        max_requests=args.requests,
        duration_s=args.duration,
        seed=args.seed,
        progress=args.progress,
    )


def _fleet_spec(
    args: argparse.Namespace, policy: str, gateways: int, router_cmd: str | None, log_dir: Path
) -> FleetSpec:
    return FleetSpec(
        workers=args.workers,
        gateways=gateways,
        policy=policy,
        sim=not args.real,
        model=args.model_path,
        worker_args=tuple(args.worker_arg),
        gateway_args=tuple(args.gateway_arg),
        router_cmd=router_cmd,
        log_dir=log_dir,
    )


def _run(args: argparse.Namespace) -> int:
    result = asyncio.run(run_load(build_sessions(args), _driver_config(args, args.target)))
    path = write_report(
        {args.workload: result},
        args.out,
        f"kvgate loadtest: {args.workload}",
        notes=[f"target {args.target}", " ".join(sys.argv)],
    )
    print(markdown_table({args.workload: summarize(result)}))
    print(f"report: {path}")
    return 0


def _fleet(args: argparse.Namespace) -> int:
    spec = _fleet_spec(args, args.policy, args.gateways, None, Path("loadtest-results/fleet-logs"))
    stop = {"now": False}
    # SIGINT too, explicitly: a shell starts background jobs with SIGINT ignored, and Python would keep
    # ignoring it, so Ctrl-C (or kill -INT) must not depend on the inherited disposition.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    with launch(spec) as fleet:
        print("workers: " + " ".join(fleet.worker_urls))
        print("gateways: " + " ".join(fleet.gateway_urls), flush=True)
        deadline = time.monotonic() + args.hold if args.hold else float("inf")
        while not stop["now"] and time.monotonic() < deadline:
            time.sleep(0.2)
    return 0


def _compare_runs(args: argparse.Namespace) -> list[tuple[str, str, int, str | None]]:
    counts = [int(c) for c in args.gateway_counts.split(",")] if args.gateway_counts else [args.gateways]
    runs: list[tuple[str, str, int, str | None]] = []
    for policy in [p for p in args.policies.split(",") if p]:
        for n in counts:
            label = policy if len(counts) == 1 else f"{policy} ×{n} gateways"
            runs.append((label, policy, n, None))
    for item in args.router_cmd:
        name, _, cmd = item.partition("=")
        runs.append((name, "", 1, cmd))
    return runs


def _compare(args: argparse.Namespace) -> int:
    results: dict[str, RunResult] = {}
    for label, policy, gateways, cmd in _compare_runs(args):
        log_dir = args.out / "logs" / label.replace(" ", "_").replace("×", "x")
        with launch(_fleet_spec(args, policy, gateways, cmd, log_dir)) as fleet:
            sessions = build_sessions(args)
            results[label] = asyncio.run(
                run_load(sessions, _driver_config(args, ",".join(fleet.gateway_urls)))
            )
        print(f"{label}: done", flush=True)
    baseline = next(iter(results), None)
    path = write_report(
        results,
        args.out,
        f"kvgate compare: {args.workload}, {args.workers} workers",
        baseline=baseline,
        notes=[" ".join(sys.argv)],
    )
    print(markdown_table({k: summarize(v) for k, v in results.items()}, baseline))
    print(f"report: {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    handlers = {"run": _run, "fleet": _fleet, "compare": _compare}
    try:
        return handlers[args.loadtest_command](args)
    except (ValueError, RuntimeError, TimeoutError, OSError) as exc:
        print(f"kvgate loadtest: {exc}", file=sys.stderr)
        return 1

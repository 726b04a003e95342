"""PD with role rebalancing versus a fixed prefill/decode split, on a workload that shifts half-way.

A sim fleet of ``--workers`` ``both``-capable workers shares a private ``redis-server`` as its KV tier;
the gateway runs the ``pd_disaggregation`` policy. Both configurations start from the same split (role
pools put half the workers in each pool); the *fixed* one never moves a worker (``dwell_s`` = forever),
the *rebalanced* one lets ``gateway.fleet.pools`` move them. The open-loop workload has two phases:

1. prefill-heavy: long unique prompts (``--long-prompt`` tokens), few output tokens;
2. decode-heavy: short prompts, many output tokens (``ignore_eos``), so decode batch slots saturate.

Per configuration and phase: completed requests, output tokens/s (the phase's output tokens over the time
from the phase's start until its last request finished), TTFT p50/p95, and the pool moves seen.

Run: ``python -m loadtest.bench_pd --phase-s 20 --rate 6`` (about 2 x (2 x phase-s + 10) seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadtest.driver import DriverConfig, RequestRecord, run_load
from loadtest.fleet import FleetSpec, free_port, launch
from loadtest.report import percentile
from loadtest.workloads import Session, WorkRequest

MODEL = "kvgate-sim"
_LETTERS = "abcdefghijklmnopqrstuvwxyz "


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    prompt_tokens: int
    max_tokens: int


def _prompt(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_LETTERS) for _ in range(n))  # the sim is byte-level: one char, one token


def build_sessions(phases: Sequence[Phase], rate: float, phase_s: float, seed: int) -> list[Session]:
    """Poisson arrivals at ``rate``/s, ``phase_s`` seconds per phase, each request its own session."""
    rng = random.Random(seed)
    out: list[Session] = []
    t = 0.0
    for index, phase in enumerate(phases):
        end = (index + 1) * phase_s
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                t = end
                break
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": _prompt(rng, phase.prompt_tokens)}],
                "max_tokens": phase.max_tokens,
                "ignore_eos": True,
            }
            out.append(Session(f"{phase.name}-{len(out)}", (WorkRequest("chat", body),), arrival_s=t))
    return out


@contextlib.contextmanager
def redis_tier(log_dir: Path) -> Iterator[str]:
    """A private redis-server for the KV tier, stopped on exit."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("bench_pd needs redis-server on PATH")
    port = free_port()
    cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with open(log_dir / "redis-tier.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def summarize(records: list[RequestRecord], phase_s: float, names: Sequence[str]) -> list[dict[str, object]]:
    rows = []
    for i, name in enumerate(names):
        mine = [r for r in records if i * phase_s <= r.start_s < (i + 1) * phase_s]
        ok = [r for r in mine if r.ok]
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        rows.append(
            {
                "phase": name,
                "sent": len(mine),
                "ok": len(ok),
                # output tokens over the time until the phase's last request finished
                "out_tok_s": sum(r.completion_tokens for r in ok)
                / max((max((r.start_s + r.e2e_s for r in ok), default=0.0) - i * phase_s), 1e-9),
                "ttft_p50": percentile(ttft, 50),
                "ttft_p95": percentile(ttft, 95),
                "e2e_p50": percentile([r.e2e_s for r in ok], 50),
            }
        )
    return rows


async def _watch_pools(gateway: str, stop: asyncio.Event, seen: list[str]) -> None:
    async with httpx.AsyncClient(timeout=2) as client:
        last: dict[str, str] = {}
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                for w in (await client.get(f"{gateway}/admin/workers")).json()["workers"]:
                    pool = (w.get("pool") or {}).get("pool", w["role"])
                    if last.get(w["id"]) not in (None, pool):
                        seen.append(f"{w['id']} -> {pool} ({(w.get('pool') or {}).get('reason')})")
                    last[w["id"]] = pool
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


async def _drive(
    gateway: str, sessions: list[Session], duration_s: float
) -> tuple[list[RequestRecord], list[str]]:
    stop, moves = asyncio.Event(), list[str]()
    watcher = asyncio.create_task(_watch_pools(gateway, stop, moves))
    cfg = DriverConfig(target=gateway, stream=True, duration_s=duration_s, request_timeout_s=120.0)
    result = await run_load(sessions, cfg)
    stop.set()
    await watcher
    return result.records, moves


def run_config(
    args: argparse.Namespace, pools: str, tier: str, log_dir: Path
) -> tuple[list[dict[str, object]], list[str]]:
    phases = [Phase("prefill-heavy", args.long_prompt, 4), Phase("decode-heavy", 64, args.long_output)]
    policy = log_dir / "policy.yaml"
    policy.write_text("policy:\n  type: pd_disaggregation\n  params: {min_uncached_tokens: 512}\n")
    spec = FleetSpec(
        workers=args.workers,
        policy="pd_disaggregation",
        worker_args=(
            "--kv-tier", tier, "--prefill-tps", str(args.prefill_tps), "--decode-tps", "50",
            "--max-running", str(args.max_running), "--log-level", "warning",
        ),
        gateway_args=("--policy-config", str(policy), "--tokenizer", "bytes", "--role-pools", pools,
                      "--health-interval-s", "0.25"),
        log_dir=log_dir,
    )  # fmt: skip
    sessions = build_sessions(phases, args.rate, args.phase_s, args.seed)
    with launch(spec) as fleet:
        records, moves = asyncio.run(_drive(fleet.gateway_urls[0], sessions, 2 * args.phase_s))
    return summarize(records, args.phase_s, [p.name for p in phases]), moves


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--phase-s", type=float, default=20.0)
    p.add_argument("--rate", type=float, default=6.0, help="requests per second (Poisson)")
    p.add_argument("--long-prompt", type=int, default=2000)
    p.add_argument("--long-output", type=int, default=200)
    p.add_argument("--prefill-tps", type=float, default=5000.0)
    p.add_argument("--max-running", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("loadtest-results/bench_pd"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    slots = f"prefill_slots=1,decode_slots={args.max_running},ratio=2,min_pressure=1,interval_s=0.5"
    configs = {"fixed split": f"{slots},dwell_s=1e9", "rebalanced": f"{slots},dwell_s=3"}
    lines = [
        "| config | phase | sent | ok | output tok/s | TTFT p50 s | TTFT p95 s | e2e p50 s |",
        "|" + "---|" * 8,
    ]
    for name, pools in configs.items():
        log_dir = args.out / name.replace(" ", "_")
        log_dir.mkdir(parents=True, exist_ok=True)
        with redis_tier(log_dir) as tier:
            rows, moves = run_config(args, pools, tier, log_dir)
        lines.extend(
            f"| {name} | {r['phase']} | {r['sent']} | {r['ok']} | {r['out_tok_s']:.0f} | "
            f"{r['ttft_p50']:.3f} | {r['ttft_p95']:.3f} | {r['e2e_p50']:.3f} |"
            for r in rows
        )
        print(f"{name}: pool moves: {moves or 'none'}", file=sys.stderr)
    report = "\n".join(lines)
    (args.out / "report.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

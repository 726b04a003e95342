"""Routing on a foreign engine's own load signal vs on the gateway's in-flight count alone.

Run: ``python -m loadtest.bench_engine_load [--engine lmdeploy|sglang|trtllm|tgi|mii] [--mode concurrent|
sequential] [--requests 160] [--duration-s 60] [--concurrency 12] [--slow-factor 4]``.

A fleet of 4 fakes of one engine (``tests/support/engines``, started as processes: ``python -m
tests.support.engines ENGINE``), worker 0 slowed ``--slow-factor`` times (prefill and decode), each with 4
running slots and a waiting queue behind them, and two kvgate gateways side by side over the same fleet:

- ``engine load``: ``--worker URL``; the gateway detects the engine and reads its load signal (running,
  waiting, KV usage from the engine's Prometheus ``/metrics``, SGLang's ``/v1/loads``, TensorRT-LLM's JSON
  ``/metrics``);
- ``in-flight only``: the same, with ``--engine-load off``: the engine is detected as before (same cache
  facts, events and request shaping), but its load signal is not read and the gateway's own in-flight count
  stands in.

Both gateways get the same flags otherwise (``--health-interval-s 0.5`` so the engine signal is at most half
a second old). The same mixed workload goes through each: short unique questions and long prompts sharing a
few prefixes, streamed, closed loop at ``--concurrency``, bounded by ``--requests`` and ``--duration-s``.

``--mode concurrent`` (default) drives both gateways at once: each gateway sees only its own half of the
traffic while the engines' queues hold both halves, the case where the engine's own queue matters (several
gateway replicas, or clients that bypass the gateway). ``--mode sequential`` drives one gateway, resets the
fakes' caches, then the other, on an otherwise idle fleet. Printed: per gateway, requests ok/failed, TTFT
p50/p99 (client side), and requests served per worker (worker 0 is the slow one).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from kvgate_core.net import free_ports
from loadtest.driver import DriverConfig, RunResult, run_load
from loadtest.fleet import Fleet, stop_fleet
from loadtest.report import percentile
from loadtest.workloads import Session, WorkloadSpec, shared_prefix, unique

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]
#: served model and extra flags of each engine's fake
ENGINES: dict[str, tuple[str, tuple[str, ...]]] = {
    "lmdeploy": ("lmdeploy-fake", ()),
    "sglang": ("sglang-fake", ("--page-size", "16")),
    "trtllm": ("trtllm-fake", ()),
    "tgi": ("fake-org/tgi-fake", ("--max-input-tokens", "16383", "--max-total-tokens", "16384")),
    "mii": ("fake-org/mii-fake", ()),
}
FAKE_TIMING = ("--max-running", "4", "--prefill-ms-per-token", "0.2", "--decode-ms-per-token", "10")
GATEWAY_FLAGS = ("--health-interval-s", "0.5")
CASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine load", ()),
    ("in-flight only", ("--engine-load", "off")),
)


@dataclass(frozen=True, slots=True)
class Bench:
    engine: str
    workers: int
    slow_factor: float
    mode: str
    requests: int
    duration_s: float
    concurrency: int
    log_dir: Path


def _spawn(fleet: Fleet, cmd: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            list(cmd), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    fleet.procs.append(proc)
    return proc


def _wait(fleet: Fleet, urls: Sequence[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while True:
            if any(p.poll() is not None for p in fleet.procs):
                raise RuntimeError(f"a process exited early; see the logs under {url!r}'s log dir")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready within {timeout_s}s")
            time.sleep(0.1)


def start(bench: Bench) -> Fleet:
    """The fakes (worker 0 slowed) and one gateway per case, all ready."""
    fleet = Fleet()
    _, flags = ENGINES[bench.engine]
    ports = free_ports(bench.workers + len(CASES))
    for i, port in enumerate(ports[: bench.workers]):
        slow = ("--slow-factor", str(bench.slow_factor)) if i == 0 else ()
        cmd = [sys.executable, "-m", "tests.support.engines", bench.engine, "--port", str(port),
               *FAKE_TIMING, *flags, *slow]  # fmt: skip
        fleet.worker_procs.append(_spawn(fleet, cmd, bench.log_dir / f"{bench.engine}-{i}.log"))
        fleet.worker_urls.append(f"http://{HOST}:{port}")
    _wait(fleet, [u + "/_fake/state" for u in fleet.worker_urls])
    for (name, case_flags), port in zip(CASES, ports[bench.workers :], strict=True):
        workers = [a for u in fleet.worker_urls for a in ("--worker", u)]
        cmd = [sys.executable, "-m", "kvgate.cli", "gateway", "--host", HOST, "--port", str(port), *workers,
               *GATEWAY_FLAGS, *case_flags]  # fmt: skip
        log = bench.log_dir / f"gateway-{name.replace(' ', '-')}.log"
        fleet.gateway_procs.append(_spawn(fleet, cmd, log))
        fleet.gateway_urls.append(f"http://{HOST}:{port}")
    _wait(fleet, [u + "/ready" for u in fleet.gateway_urls])
    time.sleep(2.0)  # a few health rounds: engine detection and the first load readings
    return fleet


def workload(model: str, seed: int) -> list[Session]:
    """Long prompts over 4 shared prefixes (about 3.6k byte tokens) and twice as many short unique ones."""
    long = shared_prefix(WorkloadSpec(model=model, seed=seed, num_sessions=4, turns=16, prefix_words=600,
                                      question_words=20, max_tokens=16))  # fmt: skip
    short = unique(WorkloadSpec(model=model, seed=seed + 1, num_sessions=32, turns=4, prefix_words=120,
                                max_tokens=16))  # fmt: skip
    sessions = long + short
    random.Random(seed).shuffle(sessions)
    return sessions


async def drive(bench: Bench, targets: Sequence[str], sessions: list[Session]) -> list[RunResult]:
    configs = [
        DriverConfig(target=t, stream=True, concurrency=bench.concurrency, max_requests=bench.requests,
                     duration_s=bench.duration_s, request_timeout_s=60.0)
        for t in targets
    ]  # fmt: skip
    return list(await asyncio.gather(*(run_load(sessions, c) for c in configs)))


def load_signals(fleet: Fleet) -> list[str]:
    out = []
    for url in fleet.gateway_urls:
        rows = httpx.get(url + "/admin/workers", timeout=5).json()["workers"]
        out.append(",".join(sorted({str((r.get("engine") or {}).get("load_signal", "?")) for r in rows})))
    return out


def report(bench: Bench, fleet: Fleet, results: Sequence[RunResult], signals: Sequence[str]) -> str:
    ids = [u.removeprefix("http://") for u in fleet.worker_urls]
    head = (
        f"engine {bench.engine}: {bench.workers} fakes, worker 0 slowed x{bench.slow_factor}; "
        f"mode {bench.mode}; {bench.concurrency} streams per gateway, <= {bench.requests} requests"
    )
    columns = (
        "| gateway | load signal | ok | failed | TTFT p50 ms | TTFT p99 ms | requests per worker (w0 slow…) |"
    )
    lines = [head, "", columns, "|---|---|---|---|---|---|---|"]
    for (name, _), result, sig in zip(CASES, results, signals, strict=True):
        ok = [r for r in result.records if r.ok]
        ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
        per = Counter(r.worker for r in ok)
        counts = ", ".join(str(per.get(i, 0)) for i in ids)
        lines.append(f"| {name} | {sig} | {len(ok)} | {len(result.records) - len(ok)} | "
                     f"{percentile(ttft, 50):.0f} | {percentile(ttft, 99):.0f} | {counts} |")  # fmt: skip
    return "\n".join(lines)


def reset(fleet: Fleet) -> None:
    for url in fleet.worker_urls:
        httpx.post(url + "/_fake/reset", timeout=5)


def run(bench: Bench) -> str:
    model, _ = ENGINES[bench.engine]
    sessions = workload(model, seed=0)
    fleet = start(bench)
    try:
        if bench.mode == "concurrent":
            results = asyncio.run(drive(bench, fleet.gateway_urls, sessions))
        else:
            results = []
            for url in fleet.gateway_urls:
                reset(fleet)
                results += asyncio.run(drive(bench, [url], sessions))
        return report(bench, fleet, results, load_signals(fleet))
    finally:
        stop_fleet(fleet)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--engine", choices=sorted(ENGINES), default="lmdeploy")
    parser.add_argument("--mode", choices=("concurrent", "sequential"), default="concurrent")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slow-factor", type=float, default=4.0)
    parser.add_argument("--requests", type=int, default=160, help="per gateway")
    parser.add_argument("--duration-s", type=float, default=60.0, help="per gateway run")
    parser.add_argument("--concurrency", type=int, default=12, help="streams per gateway")
    parser.add_argument("--log-dir", type=Path, default=Path("loadtest-results/logs/engine-load"))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the fleet on SIGTERM too
    bench = Bench(args.engine, args.workers, args.slow_factor, args.mode, args.requests, args.duration_s,
                  args.concurrency, args.log_dir)  # fmt: skip
    print(run(bench))


if __name__ == "__main__":
    main()

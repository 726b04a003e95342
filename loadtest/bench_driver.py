"""The load driver's own ceiling: requests/s it drives against an instant no-op server, and its CPU cost.

``python -m loadtest.bench_driver [--duration-s 5] [--concurrency 64]``. The server is the instant mock
worker of ``loadtest.bench_proxy`` in its own process; the driver runs here, so its figures are what
limits any benchmark that uses it on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time

from loadtest.bench_proxy import wait_http
from loadtest.driver import DriverConfig, run_load
from loadtest.fleet import free_port
from loadtest.workloads import Session, WorkRequest


def _sessions(n: int) -> list[Session]:
    req = WorkRequest(
        "chat", {"model": "mock", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    )
    return [Session(f"s{i}", (req,)) for i in range(n)]


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure(url: str, concurrency: int, duration_s: float, stream: bool) -> tuple[float, float, int]:
    """(requests/s, driver CPU µs per request, errors) for one closed-loop run."""
    cfg = DriverConfig(target=url, stream=stream, concurrency=concurrency, duration_s=duration_s)
    cpu0, t0 = _cpu_s(), time.perf_counter()
    result = asyncio.run(run_load(_sessions(10_000_000 // 100), cfg))
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    n = len(result.records)
    return n / wall, cpu * 1e6 / max(1, n), sum(not r.ok for r in result.records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "loadtest.bench_proxy", "--serve-mock", str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        print(f"| mode | req/s @{args.concurrency} | driver CPU µs/request | errors |")
        print("|---|---|---|---|")
        for stream in (False, True):
            rps, cpu_us, errors = measure(
                f"http://127.0.0.1:{port}", args.concurrency, args.duration_s, stream
            )
            print(f"| {'streaming' if stream else 'non-streaming'} | {rps:,.0f} | {cpu_us:.0f} | {errors} |")
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

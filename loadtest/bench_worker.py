"""Capacity check of a worker: N concurrent clients (aiohttp) send completions; prints req/s and latency.

Usage::

    python -m loadtest.bench_worker --url http://127.0.0.1:9001 --concurrency 1000 --requests 5000 \\
        --max-tokens 8 [--stream] [--chat] [--pid PID]

With ``--pid`` it also prints the worker's CPU time per request (from ``/proc/PID/stat``), the steadier
figure on a shared machine. This is a measurement tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass

import aiohttp
import orjson


@dataclass(frozen=True, slots=True)
class BenchResult:
    requests: int
    errors: int
    wall_s: float
    latencies_s: tuple[float, ...]
    peak_running: int


def _cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _client(
    session: aiohttp.ClientSession, url: str, body: bytes, count: list[int], out: list[float]
) -> int:
    errors = 0
    while count[0] > 0:
        count[0] -= 1
        start = time.perf_counter()
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            payload = await resp.read()
            if resp.status != 200 or (b"[DONE]" not in payload and b'"usage"' not in payload):
                errors += 1
        out.append(time.perf_counter() - start)
    return errors


async def _watch_load(
    session: aiohttp.ClientSession, base: str, peak: list[int], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        async with session.get(f"{base}/load") as resp:
            peak[0] = max(peak[0], orjson.loads(await resp.read())["running"])
        await asyncio.sleep(0.2)


async def run_bench(
    base: str, concurrency: int, requests: int, max_tokens: int, *, stream: bool, chat: bool
) -> BenchResult:
    doc: dict[str, object] = {"max_tokens": max_tokens, "stream": stream, "ignore_eos": True}
    if chat:
        doc["messages"] = [{"role": "user", "content": "benchmark prompt " * 8}]
    else:
        doc["prompt"] = "benchmark prompt " * 8
    body = orjson.dumps(doc)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    connector = aiohttp.TCPConnector(limit=concurrency + 1)
    latencies: list[float] = []
    count, peak, stop = [requests], [0], asyncio.Event()
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        watcher = asyncio.create_task(_watch_load(session, base, peak, stop))
        start = time.perf_counter()
        errors = await asyncio.gather(
            *(_client(session, base + path, body, count, latencies) for _ in range(concurrency))
        )
        wall = time.perf_counter() - start
        stop.set()
        await watcher
    return BenchResult(len(latencies), sum(errors), wall, tuple(latencies), peak[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--chat", action="store_true", help="chat completions (renders the template)")
    parser.add_argument("--pid", type=int, default=None, help="worker PID, for its CPU time per request")
    args = parser.parse_args()
    cpu0 = _cpu_s(args.pid)
    base = args.url.rstrip("/")
    bench = run_bench(
        base, args.concurrency, args.requests, args.max_tokens, stream=args.stream, chat=args.chat
    )
    r = asyncio.run(bench)
    cpu = _cpu_s(args.pid) - cpu0
    lat = sorted(r.latencies_s)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    line = (
        f"requests={r.requests} errors={r.errors} wall={r.wall_s:.2f}s req/s={r.requests / r.wall_s:.0f} "
        f"p50={statistics.median(lat) * 1e3:.1f}ms p99={p99 * 1e3:.1f}ms peak_running={r.peak_running}"
    )
    if args.pid:
        line += f" worker_cpu_per_req={cpu / r.requests * 1e6:.0f}us"
    print(line)


if __name__ == "__main__":
    main()

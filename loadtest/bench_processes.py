"""How requests/s scale with ``kvgate gateway --processes N``, under a load client that is not the bottleneck.

Run: ``python -m loadtest.bench_processes [--processes 1,2,4] [--client-procs 4] [--connections 64]
[--duration-s 5] [--num-workers 8] [--peer vllm-router]``.

``loadtest.bench_proxy`` drives a router from ONE client process, which on a small machine shares the cores
with the gateway and caps what several gateway processes can show. Here the load comes from
``--client-procs`` processes (``--connections`` split between them, each a ``bench_proxy`` client on
keep-alive connections), in front of ``--num-workers`` instant mock workers, and each gateway variant runs
in turn: ``round_robin``, no tokenizer, ``--processes N``. Per variant and mode (non-streaming, streaming
8 chunks): total requests/s, its ratio to one process, p50 latency and CPU µs per request over the
gateway's whole process tree (its children and private ``redis-server`` included). ``--peer`` adds a Rust
router on the same load (``loadtest.router_cmd``), for the ratio of CPU per request.

The figures mean something only where the machine has cores to spare for the clients and workers
(``os.cpu_count()`` is printed): on a 2-core machine the clients take the cores a second gateway process
would use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate_core.net import free_ports
from loadtest.bench_proxy import client_argv, kvgate_router, wait_http
from loadtest.router_cmd import peer_command, tree_cpu_s


@dataclass(frozen=True, slots=True)
class Load:
    """One measurement's load: total connections split over ``client_procs`` processes."""

    connections: int
    client_procs: int
    duration_s: float
    max_requests: int


@dataclass(frozen=True, slots=True)
class Cell:
    """A router under one load, one mode."""

    rps: float
    p50_ms: float
    cpu_us: float
    errors: int


def _spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(5)


def split(total: int, parts: int) -> list[int]:
    """``total`` connections over ``parts`` clients, as even as whole numbers allow (none empty)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _load_once(port: int, load: Load, stream: bool, pid: int) -> Cell:
    """Every client process at once; requests/s summed, p50 the clients' median of medians."""
    cpu0 = tree_cpu_s(pid)
    mode = "stream" if stream else "non-stream"
    clients = [
        subprocess.Popen(
            client_argv(port, conns, load.duration_s, mode, load.max_requests // load.client_procs, (0, 0.0)),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for conns in split(load.connections, load.client_procs)
    ]
    cells = []
    for client in clients:
        out, _ = client.communicate(timeout=load.duration_s + 60)
        cells.append(json.loads(out))
    requests = sum(c["requests"] for c in cells)
    p50s = sorted(c["p50_ms"] for c in cells)
    return Cell(
        rps=sum(c["rps"] for c in cells),
        p50_ms=p50s[len(p50s) // 2],
        cpu_us=(tree_cpu_s(pid) - cpu0) * 1e6 / max(1.0, requests),
        errors=int(sum(c["errors"] for c in cells)),
    )


def _measure(argv: Sequence[str], port: int, ready: str, load: Load, log: Path) -> dict[bool, Cell]:
    proc = _spawn(argv, log)
    try:
        wait_http(f"http://127.0.0.1:{port}{ready}", timeout_s=90)
        time.sleep(1.5)  # every child of a multi-process router has joined the port
        _load_once(port, Load(load.connections, load.client_procs, 1.0, load.max_requests), False, proc.pid)
        return {stream: _load_once(port, load, stream, proc.pid) for stream in (False, True)}
    finally:
        _stop([proc])


def table(results: dict[str, dict[bool, Cell]], base: str) -> str:
    """A row per router and mode; requests/s also as a ratio to ``base`` (one kvgate process)."""
    lines = [
        "| router | mode | req/s | × 1 process | p50 ms | CPU µs/req | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for stream in (False, True):
        for name, cells in results.items():
            cell = cells[stream]
            ratio = cell.rps / max(1e-9, results[base][stream].rps)
            lines.append(
                f"| {name} | {'stream' if stream else 'non-stream'} | {cell.rps:,.0f} | {ratio:.2f} | "
                f"{cell.p50_ms:.2f} | {cell.cpu_us:.0f} | {cell.errors} |"
            )
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_processes", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--processes", default="1,2,4", help="comma-separated --processes values (default 1,2,4)"
    )
    parser.add_argument("--client-procs", type=int, default=4, help="load client processes (default 4)")
    parser.add_argument("--connections", type=int, default=64, help="connections in all (default 64)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument(
        "--max-requests", type=int, default=2_000_000, help="cap on one measurement's requests"
    )
    parser.add_argument("--num-workers", type=int, default=8, help="instant mock workers (default 8)")
    parser.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag, repeatable")
    parser.add_argument(
        "--peer", action="append", default=[], metavar="PEER[:POLICY]", help="a Rust router too"
    )
    parser.add_argument(
        "--peer-venv", type=Path, default=Path("/tmp/peer-routers"), help="venv holding the peers"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    counts = [int(n) for n in args.processes.split(",")]
    load = Load(args.connections, args.client_procs, args.duration_s, args.max_requests)
    results: dict[str, dict[bool, Cell]] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-procs-") as tmp:
        logs = Path(tmp)
        ports = free_ports(args.num_workers)
        workers = [
            _spawn([sys.executable, "-m", "loadtest.bench_proxy", "--serve-mock", str(p)], logs / f"w{p}.log")
            for p in ports
        ]
        try:
            for port in ports:
                wait_http(f"http://127.0.0.1:{port}/health")
            for n in counts:
                router = kvgate_router(f"kvgate x{n}", ports, [*args.gateway_arg, "--processes", str(n)])
                results[router.name] = _measure(
                    router.argv, router.port, router.ready_path, load, logs / f"gw{n}.log"
                )
                sys.stderr.write(f"done: {router.name}\n")
            for spec in args.peer:
                cmd = peer_command(spec, args.peer_venv)
                port, metrics_port = free_ports(2)
                argv_ = cmd.render(port, [f"http://127.0.0.1:{p}" for p in ports], metrics_port)
                results[cmd.name] = _measure(argv_, port, cmd.ready_path, load, logs / f"{cmd.name}.log")
                sys.stderr.write(f"done: {cmd.name}\n")
        finally:
            _stop(workers)
    sys.stdout.write(
        f"--processes scaling: {args.num_workers} mock workers, {args.connections} connections over "
        f"{args.client_procs} client processes, {args.duration_s:g}s per cell, {os.cpu_count()} CPUs\n"
    )
    sys.stdout.write(table(results, f"kvgate x{counts[0]}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

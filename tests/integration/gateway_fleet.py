"""Real processes for gateway integration tests: sim workers and a ``kvgate gateway`` in front of them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready


@dataclass
class Fleet:
    gateway: str
    workers: dict[str, subprocess.Popen[bytes]]  # gateway worker id (HOST:PORT) -> process
    logs: Path
    gateway_proc: subprocess.Popen[bytes] | None = None

    def log(self, name: str) -> str:
        return (self.logs / name).read_text(errors="replace")


@contextmanager
def gateway_fleet(
    logs: Path, *, num_workers: int = 2, worker_args: Sequence[str] = (), gateway_args: Sequence[str] = ()
) -> Iterator[Fleet]:
    """Start ``num_workers`` sim workers and a gateway; stop them all by PID on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for i in range(num_workers):
            port = free_port()
            log = logs / f"worker{i}.log"
            proc = start_process(kvgate_cmd("worker", "--sim", "--port", str(port), *worker_args), log=log)
            procs.append(proc)
            workers[f"127.0.0.1:{port}"] = proc
        for (wid, proc), i in zip(workers.items(), range(num_workers), strict=True):
            wait_ready(proc, f"http://{wid}/health", logs=logs / f"worker{i}.log")
        port = free_port()
        urls = [f"--worker=http://{wid}" for wid in workers]
        args = ["--port", str(port), *urls, *gateway_args]
        gw = start_process(kvgate_cmd("gateway", *args), log=logs / "gateway.log")
        procs.append(gw)
        wait_ready(gw, f"http://127.0.0.1:{port}/ready", logs=logs / "gateway.log")
        yield Fleet(f"http://127.0.0.1:{port}", workers, logs, gw)
    finally:
        for proc in reversed(procs):
            stop_process(proc)

"""Fleet launcher: N workers (simulated or real CPU) and G gateways on loopback, stopped on exit.

Every process is started in its own session and stopped by PID (SIGTERM, then SIGKILL), also when the
caller is interrupted. With several gateways a private ``redis-server`` is started for their shared state
unless a Redis URL is given. ``router_cmd`` replaces kvgate's gateway with another router's command line
(placeholders ``{port}``, ``{workers}`` space-separated, ``{workers_csv}``) for side-by-side comparisons.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvgate_core.net import free_ports

HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """What to start. ``worker_args``/``gateway_args`` are appended to every worker/gateway command.

    ``policy`` None starts the gateways on their default policy (no ``--policy`` flag); ``worker_fragment``
    (e.g. ``kv_tokens=4096``) is appended as ``#…`` to each worker URL the gateways are given.
    """

    workers: int = 4
    gateways: int = 1
    policy: str | None = "prefix_cache_aware"
    sim: bool = True
    model: str = "tiny"
    worker_args: tuple[str, ...] = ()
    #: extra flags for individual workers (index i gets ``per_worker_args[i]``), e.g. one slow worker
    per_worker_args: tuple[tuple[str, ...], ...] = ()
    gateway_args: tuple[str, ...] = ()
    worker_fragment: str = ""
    redis_url: str | None = None
    router_cmd: str | None = None
    log_dir: Path = field(default_factory=lambda: Path("loadtest-results/logs"))
    ready_timeout_s: float = 60.0


@dataclass(slots=True)
class Fleet:
    worker_urls: list[str] = field(default_factory=list)
    gateway_urls: list[str] = field(default_factory=list)
    redis_url: str | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    worker_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gateway_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    redis_cmd: list[str] | None = None
    redis_proc: subprocess.Popen[bytes] | None = None


def free_port() -> int:
    return free_ports(1)[0]


def _kvgate(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvgate.cli", *args]


def _start(fleet: Fleet, cmd: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            list(cmd),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    fleet.procs.append(proc)
    return proc


def _wait_ready(fleet: Fleet, urls: Sequence[str], path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    while pending:
        for proc in fleet.procs:
            if proc.poll() is not None and proc is not fleet.redis_proc:
                raise RuntimeError(f"a fleet process exited early (code {proc.returncode}): {proc.args!r}")
        pending = [u for u in pending if not _ok(u + path)]
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"not ready within {timeout_s}s: {pending}")
        if pending:
            time.sleep(0.1)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def stop_fleet(fleet: Fleet, timeout_s: float = 10.0) -> None:
    """SIGTERM every process group, then SIGKILL what is left after ``timeout_s``."""
    for proc in fleet.procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in fleet.procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    fleet.procs.clear()


def _start_workers(fleet: Fleet, spec: FleetSpec, ports: Sequence[int]) -> None:
    for i, port in enumerate(ports):
        mode = ["--sim"] if spec.sim else ["--model", spec.model]
        extra = spec.per_worker_args[i] if i < len(spec.per_worker_args) else ()
        cmd = _kvgate("worker", *mode, "--host", HOST, "--port", str(port), *spec.worker_args, *extra)
        fleet.worker_procs.append(_start(fleet, cmd, spec.log_dir / f"worker-{i}.log"))
        fleet.worker_urls.append(f"http://{HOST}:{port}")


def _start_redis(fleet: Fleet, spec: FleetSpec, port: int) -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("several gateways need redis-server: install it (apt-get install redis-server)")
    fleet.redis_cmd = [exe, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    fleet.redis_proc = _start(fleet, fleet.redis_cmd, spec.log_dir / "redis.log")
    return f"redis://{HOST}:{port}/0"


def kill_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a fleet process (fault injection)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)


def restart_redis(fleet: Fleet, log: Path) -> None:
    """Start the fleet's private redis-server again on the same port (after ``kill_process``)."""
    if fleet.redis_cmd is None:
        raise RuntimeError("this fleet has no private redis-server")
    fleet.redis_proc = _start(fleet, fleet.redis_cmd, log)


def _gateway_flags(fleet: Fleet, spec: FleetSpec) -> list[str]:
    """``--worker`` per worker, then ``--policy`` and ``--state`` where they differ from the defaults."""
    fragment = f"#{spec.worker_fragment}" if spec.worker_fragment else ""
    flags = [a for u in fleet.worker_urls for a in ("--worker", u + fragment)]
    if spec.policy is not None:
        flags += ["--policy", spec.policy]
    if fleet.redis_url:
        flags += ["--state", fleet.redis_url]
    return flags


def _start_gateways(fleet: Fleet, spec: FleetSpec) -> None:
    for i, port in enumerate(free_ports(spec.gateways)):
        if spec.router_cmd:
            cmd = shlex.split(
                spec.router_cmd.format(
                    port=port, workers=" ".join(fleet.worker_urls), workers_csv=",".join(fleet.worker_urls)
                )
            )
        else:
            cmd = _kvgate("gateway", "--host", HOST, "--port", str(port), *_gateway_flags(fleet, spec),
                          *spec.gateway_args)  # fmt: skip
        fleet.gateway_procs.append(_start(fleet, cmd, spec.log_dir / f"gateway-{i}.log"))
        fleet.gateway_urls.append(f"http://{HOST}:{port}")


@contextlib.contextmanager
def launch(spec: FleetSpec) -> Iterator[Fleet]:
    """Start the fleet, wait until every worker and gateway is ready, stop everything on exit."""
    fleet = Fleet()
    try:
        ports = free_ports(spec.workers + 1)  # the workers' and a private redis-server's, picked together
        if spec.gateways > 1 and spec.router_cmd is None:
            fleet.redis_url = spec.redis_url or _start_redis(fleet, spec, ports[-1])
        _start_workers(fleet, spec, ports[:-1])
        _wait_ready(fleet, fleet.worker_urls, "/health", spec.ready_timeout_s)
        _start_gateways(fleet, spec)
        ready_path = "/health" if spec.router_cmd else "/ready"
        _wait_ready(fleet, fleet.gateway_urls, ready_path, spec.ready_timeout_s)
        yield fleet
    finally:
        stop_fleet(fleet)

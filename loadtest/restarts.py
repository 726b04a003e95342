"""Scheduled restarts for long runs: a private ``redis-server`` that can be killed and started again on the
same port, and a fleet worker killed (SIGKILL) and started again with the same command line.

Every process is started in its own session and stopped by PID (process group), like ``loadtest.fleet``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from kvgate_core.net import free_ports
from loadtest.fleet import HOST, Fleet, kill_process


def spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session, output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        return subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after ``timeout_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            kill_process(proc)


def _pong(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass(slots=True)
class RedisProcess:
    """A private redis-server on loopback (no persistence): ``start``, ``kill`` and ``start`` again."""

    log: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start it (on a free port the first time, the same port after) and wait for PONG."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("the soak needs redis-server: install it (apt-get install redis-server)")
        self.port = self.port or free_ports(1)[0]
        cmd = [exe, "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        self.proc = spawn(cmd, self.log)
        deadline = time.monotonic() + timeout_s
        while not _pong(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}: see {self.log}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL it (an outage, not a clean shutdown)."""
        if self.proc is not None:
            kill_process(self.proc)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def wait_healthy(url: str, timeout_s: float) -> bool:
    """Poll ``url``/health until it answers 200 or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return True
        time.sleep(0.1)
    return False


def restart_worker(fleet: Fleet, index: int, log: Path, down_s: float = 1.0, ready_s: float = 30.0) -> bool:
    """SIGKILL worker ``index``, wait ``down_s``, start its command again; True once it is healthy."""
    old = fleet.worker_procs[index]
    kill_process(old)
    if old in fleet.procs:
        fleet.procs.remove(old)
    time.sleep(down_s)
    if not isinstance(old.args, list):
        raise TypeError(f"a fleet worker is started from an argument list, not {old.args!r}")
    new = spawn([str(a) for a in old.args], log)
    fleet.worker_procs[index] = new
    fleet.procs.append(new)  # stop_fleet stops it with the rest
    return wait_healthy(fleet.worker_urls[index], ready_s)

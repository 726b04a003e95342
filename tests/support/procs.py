"""Helpers for tests that run real processes on loopback: free ports, starts and clean stops (readiness
polling: ``tests.support.waiting``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


#: the ports this test process handed out (free_port, free_port_run)
_GIVEN: set[int] = set()


def free_port(_given: set[int] = _GIVEN) -> int:
    """A free loopback port not handed out before in this process: the kernel may give a just-released port
    again before the server it was picked for has bound it."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _given:
            _given.add(port)
            return port


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports (an engine that opens one socket per DP rank on
    a base port + rank), none handed out before in this process."""
    while True:
        base = free_port()
        if base + count > 65_535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for offset in range(1, count):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        _GIVEN.update(range(base + 1, base + count))
        return base


def start_process(
    args: Sequence[str], *, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a process in its own session, output to ``log``."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    fh = open(log, "wb")  # noqa: SIM115 - closed by the process owner via stop_process
    return subprocess.Popen(
        list(args), stdout=fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
    )


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; by PID (the process group started for it)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def kvgate_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvgate.cli", *args]

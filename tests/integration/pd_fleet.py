"""Starting the processes of a PD fleet for the PD integration tests (stopped by the caller, by PID)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.procs import free_port, http_ok, kvgate_cmd, start_process, wait_until


def start(args: list[str], log: Path, procs: list[subprocess.Popen[bytes]]) -> str:
    """Start ``kvgate ARGS --port P`` on a free port (appended to ``procs``); returns ``HOST:PORT``."""
    port = free_port()
    proc = start_process(kvgate_cmd(*args, "--port", str(port)), log=log)
    procs.append(proc)
    return f"127.0.0.1:{port}"


def wait_ready(url: str, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    """Poll ``url`` until it answers 200; fail with every log when one of ``procs`` exited."""
    wait_until(lambda: http_ok(url) or any(p.poll() is not None for p in procs), timeout_s=60)
    if any(p.poll() is not None for p in procs):
        raise RuntimeError("\n".join(f.read_text(errors="replace") for f in logs.glob("*.log")))

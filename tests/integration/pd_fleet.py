"""Starting the processes of a PD fleet for the PD integration tests (stopped by the caller, by PID)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.procs import free_port, kvgate_cmd, start_process


def start(args: list[str], log: Path, procs: list[subprocess.Popen[bytes]]) -> str:
    """Start ``kvgate ARGS --port P`` on a free port (appended to ``procs``); returns ``HOST:PORT``."""
    port = free_port()
    proc = start_process(kvgate_cmd(*args, "--port", str(port)), log=log)
    procs.append(proc)
    return f"127.0.0.1:{port}"

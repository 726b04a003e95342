"""Waiting in tests, written once: poll a condition (sync or async) and wait for a started server."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx


def wait_until(pred: Callable[[], bool], timeout_s: float = 20.0, interval_s: float = 0.05) -> None:
    """Poll ``pred`` until it is true; raise TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"condition not met within {timeout_s}s")


async def eventually(pred: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.01) -> None:
    """Await until ``pred`` is true, yielding to the event loop between polls; TimeoutError past the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 now."""
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


Proc = subprocess.Popen[bytes]


def wait_ready(
    procs: Proc | Sequence[Proc], url: str, *, logs: Path | None = None, timeout_s: float = 60.0
) -> None:
    """Poll ``url`` until it answers 200. When one of ``procs`` exits first, fail with ``logs`` (a log file,
    or a folder whose ``*.log`` files are all shown)."""
    group = [procs] if isinstance(procs, subprocess.Popen) else list(procs)
    wait_until(lambda: http_ok(url) or any(p.poll() is not None for p in group), timeout_s=timeout_s)
    if any(p.poll() is not None for p in group):
        raise RuntimeError(f"a process exited before {url} was ready:\n{_read_logs(logs)}")


def _read_logs(logs: Path | None) -> str:
    if logs is None:
        return "(no log)"
    files = sorted(logs.glob("*.log")) if logs.is_dir() else [logs]
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')}" for f in files)

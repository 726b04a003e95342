"""Real ``kvgate worker --sim --foreign`` processes (no KV events, no tokenizer, whitespace words as tokens)
for integration tests of what a gateway does in front of an engine it cannot see inside."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready


@contextmanager
def foreign_workers(logs: Path, count: int = 2, kv_tokens: int = 4096) -> Iterator[list[str]]:
    """Start ``count`` foreign sim workers (logs under ``logs``), yield their URLs once each is healthy,
    stop them by PID on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for i in range(count):
            port = free_port()
            args = [
                "--sim",
                "--foreign",
                "--port",
                str(port),
                "--kv-tokens",
                str(kv_tokens),
                "--decode-tps",
                "2000",
            ]
            procs.append(start_process(kvgate_cmd("worker", *args), log=logs / f"worker-{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls, strict=True):
            wait_ready(proc, f"{url}/health", logs=logs, timeout_s=30)
        yield urls
    finally:
        for proc in procs:
            stop_process(proc)

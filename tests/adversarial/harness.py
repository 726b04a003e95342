"""The adversarial suite's rig: a gateway per build (compiled, plain Python) and per ``--http-server``, raw
sockets to attack it with, and the checks every case ends with (no traceback in the log, bounded memory).

Each case runs against every combination side by side, so anything that only one build or one server gets
wrong fails here first. ``compiled`` skips where the mypyc build is not current (a machine without a C
compiler, a source edited since the build) unless ``KVGATE_EXPECT_COMPILED=1`` (CI), where it fails.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready

BUILDS = ("compiled", "plain")
SERVERS = ("kvgate", "uvicorn")
#: every (build, server) pair, as pytest params with readable ids
COMBOS = [pytest.param((b, s), id=f"{b}-{s}") for b in BUILDS for s in SERVERS]

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\S*Error: ", re.MULTILINE)


def require_build(build: str) -> None:
    """Skip (or fail, under ``KVGATE_EXPECT_COMPILED=1``) a compiled case when the compiled build would not
    load: the gateway falls back to plain Python silently, and the case would test the other build twice."""
    if build != "compiled":
        return
    from kvgate_core import native

    state = native.inspect_build(environ={})
    if state.compiled:
        return
    if os.environ.get("KVGATE_EXPECT_COMPILED", "") not in ("", "0"):
        pytest.fail(f"the compiled build was expected: {state.reason}")
    pytest.skip(f"compiled build not current: {state.reason}")


@dataclass
class Gateway:
    """A running gateway under attack."""

    build: str
    server: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_mark(self) -> int:
        """Where the log ends now (``tracebacks_since`` reads from there)."""
        return self.log_path.stat().st_size

    def tracebacks_since(self, mark: int) -> list[str]:
        """Lines of the log written after ``mark`` that show a traceback or a bare exception line."""
        with self.log_path.open("rb") as fh:
            fh.seek(mark)
            text = fh.read().decode("utf-8", "replace")
        return [line for line in text.splitlines() if _TRACEBACK.search(line)]

    def rss_kib(self) -> int:
        """The gateway process's resident memory."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None
        return int(match.group(1))

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def alive(self) -> bool:
        return self.proc.poll() is None


def env_for(build: str) -> dict[str, str]:
    return {"KVGATE_PURE_PYTHON": "1" if build == "plain" else "0"}


@contextmanager
def gateway(
    logs: Path, workers: Sequence[str], *, build: str, server: str, args: Sequence[str] = ()
) -> Iterator[Gateway]:
    """A gateway in front of ``workers`` (base URLs), stopped by PID on exit."""
    require_build(build)
    port = free_port()
    log = logs / f"gateway-{build}-{server}-{port}.log"
    argv = ["--port", str(port), "--http-server", server, *(f"--worker={w}" for w in workers), *args]
    proc = start_process(kvgate_cmd("gateway", *argv), log=log, env=env_for(build))
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/health", logs=log)
        yield Gateway(build, server, port, proc, log)
    finally:
        stop_process(proc)


@contextmanager
def sim_workers(logs: Path, count: int = 2, args: Sequence[str] = ()) -> Iterator[list[str]]:
    """``count`` sim workers; their base URLs."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for i in range(count):
            port = free_port()
            log = logs / f"sim{i}-{port}.log"
            procs.append(start_process(kvgate_cmd("worker", "--sim", "--port", str(port), *args), log=log))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls, strict=True):
            wait_ready(proc, f"{url}/health")
        yield urls
    finally:
        for proc in procs:
            stop_process(proc)


def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_until_close(sock: socket.socket, timeout_s: float = 10.0, limit: int = 1 << 22) -> bytes:
    """Everything the server writes until it closes the connection (or ``timeout_s`` passes)."""
    deadline = time.monotonic() + timeout_s
    out = bytearray()
    while len(out) < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return bytes(out)


def exchange(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Write ``data`` on a fresh connection; what comes back until the server closes it."""
    with connect(port, timeout_s) as sock:
        sock.sendall(data)
        return read_until_close(sock, timeout_s)


def closed_within(sock: socket.socket, timeout_s: float) -> tuple[bool, bytes]:
    """Whether the server closes ``sock`` within ``timeout_s``, and what it wrote before."""
    deadline = time.monotonic() + timeout_s
    out = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False, bytes(out)
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return False, bytes(out)
        except ConnectionResetError:
            return True, bytes(out)
        if not data:
            return True, bytes(out)
        out += data


def statuses(raw: bytes) -> list[int]:
    """The status codes of every response in ``raw``, in order."""
    return [int(m.group(1)) for m in re.finditer(rb"HTTP/1\.[01] (\d{3}) ", raw)]


def counter(metrics: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for line in metrics.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total

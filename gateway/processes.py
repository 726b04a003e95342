"""``kvgate gateway --processes N``: a parent that runs N gateway processes on one port and supervises them.

Each child is an ordinary gateway (``kvgate gateway … --process-index I``) that binds the port itself with
``SO_REUSEPORT``, so the kernel spreads new connections over the children; a child that dies takes only its
own socket with it and the others keep serving while it is restarted. The children share routing state the
way gateway replicas do, through Redis: the ``--state redis://…`` given, or, with the default memory state,
a private ``redis-server`` the parent starts on a unix socket (persistence off) and stops on exit.

The parent does no request work. It waits until every child reports that it serves (a byte on a pipe), then
restarts a child that exits unexpectedly (exponential backoff, reset once a child has lived a while),
forwards SIGTERM/SIGINT (each child drains as a single gateway does) and SIGHUP (reload), and exits once
the children have. Configuration checks and the preflight run in the parent before any child starts
(``gateway.server``); what a child logs carries its index and pid (``gateway.server``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Final

logger = logging.getLogger(__name__)

#: how long every child together may take to start (each runs the preflight and opens its state)
START_TIMEOUT_S: Final = 120.0
#: a child that lived this long before dying is restarted after the first backoff step again
STABLE_S: Final = 30.0
BACKOFF_FIRST_S: Final = 0.5
BACKOFF_MAX_S: Final = 16.0
_PR_SET_PDEATHSIG: Final = 1
_FORWARDED: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: how a child that drained on a forwarded SIGTERM exits (uvicorn re-raises the signal it handled)
_CLEAN_EXITS: Final = frozenset({0, -signal.SIGTERM})

_Command = Callable[[int, int | None], list[str]]


def parse_processes(text: str) -> int:
    """``auto`` (the cores this process may run on) or a positive count.

    Raises:
        ValueError: neither.
    """
    if text == "auto":
        return len(os.sched_getaffinity(0))
    count = int(text)
    if count < 1:
        raise ValueError(f"--processes must be at least 1 or 'auto', not {text}")
    return count


def _die_with_parent() -> None:
    """In a child before exec: its own process group (a terminal's Ctrl-C reaches only the parent, which
    forwards it once) and SIGTERM when the parent dies, so a killed parent leaves no orphans."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(cmd: Sequence[str], pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start a supervised process: own process group, dies with the parent, output to the parent's."""
    return subprocess.Popen(list(cmd), pass_fds=tuple(pass_fds), process_group=0, preexec_fn=_die_with_parent)


@contextlib.contextmanager
def private_redis(redis_server: str, timeout_s: float = 10.0) -> Iterator[str]:
    """A ``redis-server`` on a unix socket in a private directory, no persistence; yields its ``unix://``
    URL and stops it (by pid) on exit.

    Raises:
        RuntimeError: it did not answer PING within ``timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix="kvgate-state-") as tmp:
        path = Path(tmp) / "redis.sock"
        cmd = [redis_server, "--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700",
               "--save", "", "--appendonly", "no", "--dir", tmp, "--loglevel", "warning"]  # fmt: skip
        proc = spawn(cmd)
        try:
            _wait_ping(path, proc, timeout_s)
            yield f"unix://{path}"
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _wait_ping(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(1.0)
            sock.connect(str(path))
            sock.sendall(b"PING\r\n")
            if sock.recv(16).startswith(b"+PONG"):
                return
        time.sleep(0.05)
    raise RuntimeError(f"the private redis-server on {path} did not start (exit code {proc.poll()})")


def find_redis_server() -> str | None:
    return shutil.which("redis-server")


@dataclass(slots=True)
class _Slot:
    """One child position: its process, when it started and when it may be restarted."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff_s: float = BACKOFF_FIRST_S
    restart_at: float | None = None


@dataclass(slots=True)
class Supervisor:
    """Starts ``num_processes`` children from ``command(index, ready_fd)`` and keeps them running.

    ``command`` returns the argv of child ``index``; ``ready_fd`` is the write end of a pipe the child
    writes one byte to once it serves (None for a restart, whose readiness nobody waits on).
    """

    num_processes: int
    command: _Command
    grace_s: float
    slots: list[_Slot] = field(default_factory=list)
    stop_signal: int | None = None

    def run(self) -> int:
        """Start every child, supervise until a stop signal, and return the exit code (0: every child
        started and drained cleanly; 1: a child failed to start or exited with an error on stop)."""
        previous = {s: signal.signal(s, self._on_signal) for s in _FORWARDED}
        try:
            if not self._start_all():
                if self.stop_signal is not None:  # stopped while starting: a stop like any other
                    return self._reap(self.grace_s + 10.0)
                self._forward(signal.SIGTERM)
                self._reap(self.grace_s)
                return 1
            logger.info("%d gateway processes serving", self.num_processes)
            while self.stop_signal is None:
                self._tick(time.monotonic())
                time.sleep(0.1)
            return self._reap(self.grace_s + 10.0)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """SIGHUP: forwarded (reload). The first SIGTERM/SIGINT: SIGTERM to every child (a graceful drain);
        a SIGINT after it: SIGINT, which makes uvicorn give up the drain, as a second Ctrl-C does."""
        if signum == signal.SIGHUP:
            self._forward(signum)
            return
        first = self.stop_signal is None
        self.stop_signal = signum
        self._forward(signal.SIGTERM if first or signum != signal.SIGINT else signal.SIGINT)

    def _forward(self, signum: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.proc.pid, signum)

    def _start_all(self) -> bool:
        pipes: dict[int, _Slot] = {}
        for index in range(self.num_processes):
            read_fd, write_fd = os.pipe()
            slot = _Slot(index)
            self.slots.append(slot)
            try:
                self._launch(slot, write_fd)
            finally:
                os.close(write_fd)
            pipes[read_fd] = slot
        try:
            return self._await_ready(pipes)
        finally:
            for fd in pipes:
                os.close(fd)

    def _await_ready(self, pipes: dict[int, _Slot]) -> bool:
        waiting = set(pipes)
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting and self.stop_signal is None:
            if time.monotonic() > deadline:
                logger.error("gateway processes not serving after %.0f s", START_TIMEOUT_S)
                return False
            readable, _, _ = select.select(list(waiting), [], [], 0.2)
            for fd in readable:
                waiting.discard(fd)
                if not os.read(fd, 1) and self.stop_signal is None:  # closed, no byte: exited early
                    slot = pipes[fd]
                    code = slot.proc.wait() if slot.proc is not None else None
                    logger.error("gateway process %d failed to start (exit code %s)", slot.index, code)
                    return False
        return self.stop_signal is None

    def _launch(self, slot: _Slot, ready_fd: int | None) -> None:
        fds = () if ready_fd is None else (ready_fd,)
        slot.proc = spawn(self.command(slot.index, ready_fd), pass_fds=fds)
        slot.started_at = time.monotonic()
        slot.restart_at = None

    def _tick(self, now: float) -> None:
        """Schedule a restart for each child that exited; restart those whose backoff has passed."""
        for slot in self.slots:
            if slot.restart_at is not None:
                if now >= slot.restart_at:
                    logger.warning("restarting gateway process %d", slot.index)
                    self._launch(slot, None)
                continue
            if slot.proc is None or (code := slot.proc.poll()) is None:
                continue
            if now - slot.started_at >= STABLE_S:
                slot.backoff_s = BACKOFF_FIRST_S
            slot.restart_at = now + slot.backoff_s
            logger.warning(
                "gateway process %d (pid %d) exited with code %s; restarting in %.1f s",
                slot.index, slot.proc.pid, code, slot.backoff_s,
            )  # fmt: skip
            slot.backoff_s = min(BACKOFF_MAX_S, slot.backoff_s * 2)

    def _reap(self, timeout_s: float) -> int:
        """Wait for every child to exit (SIGKILL after ``timeout_s``); 0 when each exited with 0."""
        deadline = time.monotonic() + timeout_s
        failed = False
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                code = slot.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.error("gateway process %d did not drain in time; killing it", slot.index)
                slot.proc.kill()
                code = slot.proc.wait()
            failed |= code not in _CLEAN_EXITS and slot.restart_at is None
        return 1 if failed else 0

"""Real processes for the engine-profile tests: engine fakes and one kvgate gateway in front of them.

``engine_fleet`` starts N fakes of one engine (``python -m tests.support.engines``) and a gateway given
nothing but ``--host 127.0.0.1 --port P --worker URL…`` plus the caller's ``gateway_flags``; it waits until
every process answers, and stops them all by PID on exit.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready, wait_until


@dataclass
class EngineFleet:
    """The fakes' and the gateway's base URLs, and helpers to read and steer them."""

    engine: str
    fakes: list[str]
    gateway: str
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def fake_state(self, i: int = 0) -> dict[str, Any]:
        """The fake's ``/_fake/state``: paths hit, last bodies, engine figures."""
        doc: dict[str, Any] = httpx.get(self.fakes[i] + "/_fake/state", timeout=5).json()
        return doc

    def fault(self, i: int = 0, **faults: Any) -> None:
        httpx.post(self.fakes[i] + "/_fake/fault", json=faults, timeout=5).raise_for_status()

    def reset(self, i: int = 0) -> None:
        httpx.post(self.fakes[i] + "/_fake/reset", timeout=5).raise_for_status()

    def worker(self, i: int = 0) -> dict[str, Any]:
        """The gateway's ``/admin/workers`` row of fake ``i``."""
        rows = httpx.get(self.gateway + "/admin/workers", timeout=5).json()["workers"]
        row: dict[str, Any] = next(r for r in rows if r["url"].rstrip("/") == self.fakes[i])
        return row

    def engine_facts(self, i: int = 0) -> dict[str, Any]:
        facts: dict[str, Any] = self.worker(i).get("engine") or {}
        return facts


def start_fake(engine: str, port: int, flags: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.support.engines", engine, "--port", str(port), *flags]
    return start_process(cmd, log=log)


@contextmanager
def engine_fleet(
    engine: str,
    log_dir: Path,
    *,
    fake_flags: Sequence[Sequence[str]] = ((),),
    gateway_flags: Sequence[str] = (),
    url_suffix: str = "",
) -> Iterator[EngineFleet]:
    """One fake per entry of ``fake_flags`` (its extra flags) and a gateway in front of them all."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fakes = []
        for i, flags in enumerate(fake_flags):
            port = free_port()
            procs.append(start_fake(engine, port, flags, log_dir / f"{engine}-{i}.log"))
            fakes.append(f"http://127.0.0.1:{port}")
        for url in fakes:
            wait_ready(procs, url + "/_fake/state", logs=log_dir, timeout_s=30)
        gw_port = free_port()
        workers = [a for url in fakes for a in ("--worker", url + url_suffix)]
        cmd = kvgate_cmd("gateway", "--host", "127.0.0.1", "--port", str(gw_port), *workers, *gateway_flags)
        procs.append(start_process(cmd, log=log_dir / "gateway.log"))
        gateway = f"http://127.0.0.1:{gw_port}"
        wait_ready(procs, gateway + "/ready", logs=log_dir, timeout_s=60)
        fleet = EngineFleet(engine, fakes, gateway, log_dir, procs)
        try:  # detection normally ends with the first health round; the tests say what is missing if not
            wait_until(lambda: all(fleet.engine_facts(i).get("kind", "auto") != "auto" for i in range(len(fakes))),
                       timeout_s=15, interval_s=0.1)  # fmt: skip
        except TimeoutError:
            pass
        yield fleet
    finally:
        for proc in reversed(procs):
            stop_process(proc)

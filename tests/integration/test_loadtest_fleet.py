"""The fleet launcher and the load CLI against real sim workers and gateways."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.fleet import FleetSpec, launch
from loadtest.trace import MOONCAKE_TRACE
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
TRACE = MOONCAKE_TRACE


def _port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


def test_launch_stops_every_process_it_started(tmp_path: Path) -> None:
    with launch(FleetSpec(workers=2, gateways=2, policy="round_robin", log_dir=tmp_path)) as fleet:
        procs = list(fleet.procs)
        urls = fleet.worker_urls + fleet.gateway_urls
        assert len(procs) == 5  # 2 workers, 2 gateways, 1 redis-server for their shared state
        assert all(_port_open(u) for u in urls)
    assert all(p.poll() is not None for p in procs)
    assert not any(_port_open(u) for u in urls)


def test_fleet_command_cleans_up_when_interrupted(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvgate.cli",
            "loadtest",
            "fleet",
            "--workers",
            "2",
            "--policy",
            "round_robin",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    urls: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(u.startswith("http") for u in urls[2:]):
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(("workers:", "gateways:")):
                urls += line.split()[1:]
        assert len(urls) == 3, urls
        assert all(_port_open(u) for u in urls)
        proc.send_signal(signal.SIGINT)  # Ctrl-C reaches the launcher only; it must stop its children
        proc.wait(30)
        wait_until(lambda: not any(_port_open(u) for u in urls), timeout_s=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_trace_replay_through_a_fleet_writes_a_report(tmp_path: Path) -> None:
    with launch(FleetSpec(workers=2, policy="prefix_cache_aware", log_dir=tmp_path / "logs")) as fleet:
        out = tmp_path / "report"
        cmd = [
            sys.executable,
            "-m",
            "kvgate.cli",
            "loadtest",
            "run",
            "--target",
            fleet.gateway_urls[0],
            "--workload",
            f"trace:{TRACE}",
            "--requests",
            "30",
            "--trace-scale",
            "16",
            "--trace-speedup",
            "200",
            "--max-tokens",
            "4",
            "--duration",
            "40",
            "--out",
            str(out),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (out / "report.md").read_text()
    assert "| trace:" in report
    row = next(line for line in report.splitlines() if line.startswith("| trace:"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "30"  # requests
    assert cells[2] == "0"  # failed
    assert float(cells[10].rstrip("%")) > 0  # the trace's shared prefixes hit the cache
    assert len(list(out.glob("*.png"))) == 4

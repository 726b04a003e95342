"""``kvgate demo``: the printed curl command and openai snippet work; Ctrl-C or SIGTERM stops the workers too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import http_ok, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def _ready_demo(demo: subprocess.Popen[bytes], log: Path, timeout_s: float) -> tuple[str, list[str]]:
    """The gateway URL the demo printed (it picks another port when the asked one is taken) and its
    workers, once it is ready."""
    wait_until(lambda: "gateway on http" in log.read_text() or demo.poll() is not None, timeout_s=timeout_s)
    found = re.search(r"gateway on (http://127\.0\.0\.1:\d+)", log.read_text())
    assert found is not None, log.read_text()
    base = found.group(1)
    wait_until(lambda: http_ok(f"{base}/ready") or demo.poll() is not None, timeout_s=60)
    assert demo.poll() is None, log.read_text()
    return base, [w["url"] for w in httpx.get(f"{base}/admin/workers").json()["workers"]]


def test_demo_prints_working_commands_and_stops_its_workers(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    demo = start_process(kvgate_cmd("demo", "--port", str(free_port())), log=log)
    try:
        _, workers = _ready_demo(demo, log, timeout_s=300)
        text = log.read_text()
        curl = re.search(r"^  (curl .*?)\n\n", text, flags=re.S | re.M)
        snippet = re.search(r"<<'PY'\n(.*?)\nPY", text, flags=re.S)
        assert curl is not None and snippet is not None, text
        reply = subprocess.run(["bash", "-c", curl.group(1)], capture_output=True, check=True, timeout=120)
        assert orjson.loads(reply.stdout)["choices"][0]["message"]["content"]
        out = subprocess.run(
            [sys.executable, "-c", snippet.group(1)], capture_output=True, check=True, timeout=120
        )
        assert b"prompt_tokens=" in out.stdout
        os.kill(demo.pid, signal.SIGINT)  # what Ctrl-C sends
        demo.wait(30)
    finally:
        stop_process(demo)
    assert len(workers) == 2
    assert not any(http_ok(f"{url}/health") for url in workers)


def test_sigterm_stops_the_demos_workers_too(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    demo = start_process(kvgate_cmd("demo", "--sim", "--port", str(free_port())), log=log)
    try:
        _, workers = _ready_demo(demo, log, timeout_s=120)
        assert len(workers) == 2 and all(http_ok(f"{url}/health") for url in workers)
        os.kill(demo.pid, signal.SIGTERM)  # what kill, docker stop and systemd send
        demo.wait(30)
    finally:
        stop_process(demo)
    assert demo.returncode != 0  # ended by the signal, and says so
    assert not any(http_ok(f"{url}/health") for url in workers)

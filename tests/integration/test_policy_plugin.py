"""End to end: the example plugin, installed as a package, routes real requests through a real gateway.

The plugin under ``examples/kvgate-example-policy`` is built and installed offline with pip into a private
target directory that the gateway sees through ``PYTHONPATH`` (the shared venv is left untouched). The
gateway discovers it through the ``kvgate.policies`` entry point, validates its params from a YAML
policy config, and sends every request to the worker its code says: the lowest id not skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready
from tests.unit.policies.fleets import EXAMPLE_PLUGIN_DIR

pytestmark = pytest.mark.integration

WORKER_IDS = ("a-canary", "b-main", "c-main")


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example plugin built and installed (offline, no deps) into a private site directory."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    shutil.copytree(EXAMPLE_PLUGIN_DIR, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    site = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*cmd, "--target", str(site), str(src)], check=True, capture_output=True, timeout=110)
    assert (site / "kvgate_example_policy").is_dir()
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(site), *([existing] if existing else [])])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, plugin_path: str) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("logs")
    env = {"PYTHONPATH": plugin_path}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports = {wid: free_port() for wid in WORKER_IDS}
        for wid, port in ports.items():
            args = kvgate_cmd("worker", "--sim", "--port", str(port), "--prefill-tps", "1000000")
            procs.append(start_process(args, log=logs / f"{wid}.log"))
        for proc, (wid, port) in zip(procs, ports.items(), strict=True):
            wait_ready(proc, f"http://127.0.0.1:{port}/health", logs=logs / f"{wid}.log")
        urls = [f"--worker=http://127.0.0.1:{port}#id={wid}" for wid, port in ports.items()]
        config = logs / "policy.yaml"
        config.write_text("policy:\n  type: lowest_id\n  params: {skip_prefix: 'a-'}\n")
        port = free_port()
        args = ["--port", str(port), *urls, "--policy-config", str(config), "--tokenizer", "none"]
        procs.append(start_process(kvgate_cmd("gateway", *args), log=logs / "gateway.log", env=env))
        wait_ready(procs[-1], f"http://127.0.0.1:{port}/ready", logs=logs / "gateway.log")
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def test_installed_plugin_routes_every_request_to_the_lowest_unskipped_id(gateway: str) -> None:
    body = {"model": "kvgate-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(base_url=gateway, timeout=30) as client:
        workers = []
        for i in range(6):
            resp = client.post("/v1/chat/completions", json={**body, "user": f"u{i}"})
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["message"]["content"]
            workers.append(resp.headers["x-kvgate-worker"])
    assert workers == ["b-main"] * 6


def test_unknown_policy_stops_startup_listing_the_installed_plugin(plugin_path: str, tmp_path: Path) -> None:
    args = kvgate_cmd(
        "gateway", "--port", str(free_port()), "--worker", "http://127.0.0.1:9", "--policy", "nope"
    )
    proc = subprocess.run(
        args, env={**os.environ, "PYTHONPATH": plugin_path}, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "unknown policy 'nope'" in proc.stderr + proc.stdout
    assert "lowest_id" in proc.stderr + proc.stdout

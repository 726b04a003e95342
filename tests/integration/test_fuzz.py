"""schemathesis fuzzes the gateway's OpenAPI description (docs/openapi.yaml): no input may cause a 5xx."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.fleet import Fleet, FleetSpec, launch

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    spec = FleetSpec(
        workers=2,
        policy="prefix_cache_aware",
        worker_args=("--decode-tps", "2000"),
        log_dir=tmp_path_factory.mktemp("fuzz"),
    )
    with launch(spec) as f:
        yield f


def test_fuzzing_the_openapi_spec_finds_no_server_error(fleet: Fleet, tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("schemathesis")
    cmd = [
        str(exe),
        "run",
        str(REPO / "docs" / "openapi.yaml"),
        "--url",
        fleet.gateway_urls[0],
        "--checks",
        "not_a_server_error",
        "--max-examples",
        "25",
        "--mode",
        "all",
        "--seed",
        "1",
        "--request-timeout",
        "20",
        "--generation-deterministic",
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=220,
        cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout.lower()

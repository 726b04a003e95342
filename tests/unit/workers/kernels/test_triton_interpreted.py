"""Every Triton kernel, run by Triton's CPU interpreter, against the torch reference over a case grid.

The grids run once, in one child process (``interp_runner``) that sets ``TRITON_INTERPRET=1``
before importing triton; this pytest process never imports the kernels in interpreter mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.workers.kernels.paged_cases import DECODE_CASES, PREFILL_CASES, STORE_CASES, TOLERANCE

REPO_ROOT = Path(__file__).resolve().parents[4]
GRIDS = {"store": STORE_CASES, "decode": DECODE_CASES, "prefill": PREFILL_CASES}


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    """All kernels' grids, run once per module in one child process."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.workers.kernels.interp_runner", *GRIDS],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


PARAMS = [
    pytest.param(kernel, case, id=f"{kernel}-{case.id}") for kernel, grid in GRIDS.items() for case in grid
]


@pytest.mark.parametrize(("kernel", "case"), PARAMS)
def test_kernel_matches_reference(report, kernel, case):
    assert report["interpreted"][kernel], "the child process did not run the kernels in the interpreter"
    result = report["results"][kernel][case.id]
    assert "error" not in result, result.get("error")
    tolerance = 0.0 if kernel == "store" else TOLERANCE[case.dtype]
    assert result["err"] <= tolerance, f"max abs error {result['err']} > {tolerance}"


@pytest.mark.skipif("TRITON_INTERPRET" in os.environ, reason="TRITON_INTERPRET set by the caller")
def test_interpreter_mode_does_not_leak_into_this_process():
    pytest.importorskip("triton")
    from workers.kernels import decode_attention, prefill_attention, store_kv

    for kernel in (
        decode_attention._decode_kernel,
        prefill_attention._prefill_kernel,
        store_kv._store_kv_kernel,
    ):
        assert type(kernel).__name__ == "JITFunction"

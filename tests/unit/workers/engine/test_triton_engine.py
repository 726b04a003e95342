"""The engine on the Triton kernels (interpreted on CPU) gives the same greedy tokens as on the reference.

Triton reads ``TRITON_INTERPRET`` when a kernel module is imported, so the run happens in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.procs import REPO


@pytest.mark.slow
@pytest.mark.skipif("TRITON_INTERPRET" in os.environ, reason="TRITON_INTERPRET set by the caller")
def test_engine_on_interpreted_triton_kernels_matches_the_reference() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.workers.engine.triton_engine_runner"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["triton"] == result["reference"]
    assert set(result["triton"]) == {"a", "b"}

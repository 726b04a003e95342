"""The policy benchmark script runs and reports every built-in (no timing is asserted)."""

from __future__ import annotations

import pytest

from loadtest.bench_policies import main
from policies import available_policies, make_registry


def test_bench_prints_a_row_per_builtin(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sizes", "4", "--requests", "10", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0] for line in out.splitlines()[1:]}
    assert set(available_policies(make_registry([]))) <= rows

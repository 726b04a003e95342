from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.driver import DriverConfig, RequestRecord, RunResult
from loadtest.report import load_imbalance, markdown_table, summarize, write_report


def _result(workers: list[str], ttft: float) -> RunResult:
    recs = [
        RequestRecord(
            session=f"s{i}",
            start_s=i * 0.1,
            e2e_s=ttft * 2,
            ttft_s=ttft,
            itl_s=[0.01],
            prompt_tokens=100,
            completion_tokens=10,
            cached_tokens=50 if i % 2 else 0,
            worker=w,
        )
        for i, w in enumerate(workers)
    ]
    recs.append(RequestRecord(session="bad", start_s=0.0, error="HTTP 503"))
    return RunResult(records=recs, wall_s=2.0, config=DriverConfig(target="http://x"))


def test_summary_figures() -> None:
    s = summarize(_result(["a", "b", "a", "b"], 0.2))
    assert (s.requests, s.failed, s.workers) == (5, 1, 2)
    assert s.hit_rate == pytest.approx(0.25)
    assert s.ttft_p50 == pytest.approx(0.2)
    assert s.req_per_s == pytest.approx(2.0)


def test_imbalance_is_max_over_mean() -> None:
    assert load_imbalance(_result(["a", "a", "a", "b"], 0.1).records) == pytest.approx(1.5)


def test_comparison_table_gives_ratios_against_the_baseline() -> None:
    table = markdown_table(
        {"rr": summarize(_result(["a"], 0.4)), "pca": summarize(_result(["a"], 0.1))}, "rr"
    )
    assert "4.00× faster" in table and "| rr |" in table


def test_report_writes_markdown_and_pngs(tmp_path: Path) -> None:
    path = write_report(
        {"rr": _result(["a", "b"], 0.3), "pca": _result(["a", "b"], 0.1)}, tmp_path, "t", "rr"
    )
    text = path.read_text()
    assert "| pca |" in text
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["hit_rate_throughput.png", "latency_cdf.png", "load_per_worker.png", "ttft_cdf.png"]
    assert all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)

"""bench_pd's per-phase summary: requests split by start time, throughput and TTFT percentiles per phase."""

from __future__ import annotations

import math

import pytest

from loadtest.bench_pd import summarize
from loadtest.driver import RequestRecord


def test_phases_are_split_by_start_time_and_summarized_apart() -> None:
    records = [
        RequestRecord("a", start_s=0.0, e2e_s=2.0, ttft_s=0.1, completion_tokens=10),
        RequestRecord("b", start_s=1.0, e2e_s=1.0, ttft_s=0.3, completion_tokens=10),
        RequestRecord("c", start_s=1.5, e2e_s=1.0, error="boom"),
        RequestRecord("d", start_s=10.0, e2e_s=4.0, ttft_s=0.5, completion_tokens=40),
    ]
    first, second = summarize(records, phase_s=10.0, names=["prefill-heavy", "decode-heavy"])
    assert (first["phase"], first["sent"], first["ok"]) == ("prefill-heavy", 3, 2)
    assert first["out_tok_s"] == pytest.approx(20 / 2.0)  # until the phase's last request finished
    assert first["ttft_p50"] == pytest.approx(0.2) and first["ttft_p95"] == pytest.approx(0.29)
    assert first["e2e_p50"] == pytest.approx(1.5)
    assert (second["sent"], second["ok"], second["out_tok_s"]) == (1, 1, pytest.approx(40 / 4.0))


def test_a_phase_without_answers_reports_nan_not_an_error() -> None:
    (only,) = summarize([RequestRecord("a", start_s=0.0, error="down")], phase_s=5.0, names=["p"])
    assert only["ok"] == 0 and math.isnan(float(only["ttft_p50"])) and math.isnan(float(only["ttft_p95"]))  # type: ignore[arg-type]

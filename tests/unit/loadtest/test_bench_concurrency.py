"""The concurrency benchmark's and the soak's pure parts: requests, quantiles, reasons, rows."""

from __future__ import annotations

import orjson

from loadtest.bench_concurrency import (
    BenchConfig,
    StepResult,
    failure_reason,
    format_step,
    quantile,
    stream_call,
)
from loadtest.soak import SoakConfig, soak_call


def test_a_stream_asks_for_exactly_its_chunks() -> None:
    call = stream_call(7, 64)
    body = orjson.loads(call.body)
    assert (call.path, call.stream) == ("/v1/chat/completions", True)
    assert (body["max_tokens"], body["ignore_eos"], body["stream"]) == (64, True, True)


def test_quantile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (quantile(values, 0.5), quantile(values, 0.99), quantile(values, 1.0)) == (50.0, 99.0, 100.0)
    assert quantile([], 0.5) is None


def test_failure_reasons_group_without_ports_and_counts() -> None:
    a = failure_reason("OSError before the response: connect to 127.0.0.1:40001 timed out")
    assert a == failure_reason("OSError before the response: connect to 127.0.0.1:40777 timed out")
    assert failure_reason("HTTP 502: worker 127.0.0.1:4242 failed after 12345 chunks") == (
        "HTTP 502: worker ADDR failed after # chunks"
    )


def test_running_slots_cover_the_largest_step_unless_given() -> None:
    assert BenchConfig(streams=(1000, 10_000), workers=4).slots() == 2500
    assert BenchConfig(streams=(10_000,), workers=4, max_running=512).slots() == 512


def test_a_step_row_shows_rss_per_open_stream() -> None:
    r = StepResult(
        1000, "burst", 990, 10, 0, 7.0, 1000, 100 << 20, 120 << 20, 110 << 20, 40, 2040, 240, 0.1, 0.5
    )
    assert r.rss_per_stream == 20 * 2**20 / 1000
    assert format_step(r).startswith(
        "| 1000 | burst | 990 | 10 | 0 | 1000 | 100 / 120 / 110 | 20.5 | 40 / 2040 / 240 |"
    )


def test_the_soak_mix_covers_chat_and_completions_streaming_and_not() -> None:
    cfg = SoakConfig(prompts=4)
    calls = [soak_call(n, cfg) for n in range(4)]
    assert {(c.path, c.stream) for c in calls} == {
        ("/v1/chat/completions", True),
        ("/v1/completions", True),
        ("/v1/chat/completions", False),
        ("/v1/completions", False),
    }
    few = SoakConfig(prompts=3)
    assert len({soak_call(n, few).body for n in range(1000)}) == 4 * 3  # a bounded set of prompts

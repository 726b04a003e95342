"""The load parsers: realistic metric text and JSON of each engine, several DP ranks, malformed input."""

from __future__ import annotations

import orjson
import pytest

from gateway.engines.figures import EngineLoad, NoLoad
from gateway.engines.load import parse_load
from gateway.engines.profiles import PROFILES, EngineKind
from tests.unit.gateway.engines.answers import (
    LMDEPLOY_METRICS,
    SGLANG_LOADS,
    TGI_METRICS,
    VLLM_FIXTURES,
    VLLM_METRICS_DP2,
    trtllm_stat,
)


def _parse(kind: EngineKind, body: bytes) -> EngineLoad | NoLoad:
    """``body`` parsed as the engine's JSON signal where it has one beside Prometheus (TensorRT-LLM's JSON
    ``/metrics``, its fallback), else as its profile's signal."""
    profile = PROFILES[kind]
    if profile.fallback_load is not None and profile.fallback_load[1] == "trtllm_json":
        return parse_load(kind, "trtllm_json", body)
    return parse_load(kind, profile.load_format, body)


def test_vllm_sums_counts_over_dp_ranks_and_averages_usage() -> None:
    load = _parse(EngineKind.VLLM, VLLM_METRICS_DP2)
    assert load == EngineLoad(
        running=5,
        waiting=5,
        kv_usage=0.375,
        block_size=16,
        capacity_tokens=32000,
        prefix_caching=True,
    )


def test_vllm_waiting_by_reason_is_not_counted_as_waiting() -> None:
    load = _parse(EngineKind.VLLM, VLLM_METRICS_DP2)
    assert isinstance(load, EngineLoad) and load.waiting == 5  # not + 99


def test_vllm_pre_v1_usage_gauge_and_unsized_cache() -> None:
    text = (
        b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
        b"vllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.9\n"
        b'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'
    )
    load = _parse(EngineKind.VLLM, text)
    assert isinstance(load, EngineLoad)
    assert (load.kv_usage, load.block_size, load.capacity_tokens) == (0.9, 16, None)


@pytest.mark.parametrize(
    ("name", "running", "usage"), [("metrics_idle.txt", 0, 0.0), ("metrics_running.txt", 3, 0.0041)]
)
def test_real_vllm_0_32_metrics(name: str, running: int, usage: float) -> None:
    load = _parse(EngineKind.VLLM, (VLLM_FIXTURES / name).read_bytes())
    assert isinstance(load, EngineLoad)
    assert load.running == running and load.waiting == 0
    assert load.kv_usage == pytest.approx(usage, abs=1e-4)
    assert (load.block_size, load.capacity_tokens, load.prefix_caching) == (32, 23296, True)


def test_lmdeploy_waiting_counts_the_api_queue_too() -> None:
    load = _parse(EngineKind.LMDEPLOY, LMDEPLOY_METRICS)
    assert load == EngineLoad(running=6, waiting=5, kv_usage=0.75)


def test_tgi_usage_is_reserved_tokens_over_the_batch_budget() -> None:
    load = _parse(EngineKind.TGI, TGI_METRICS)
    assert load == EngineLoad(running=12, waiting=5, kv_usage=0.25, capacity_tokens=16384)


def test_sglang_loads_over_dp_ranks() -> None:
    load = _parse(EngineKind.SGLANG, orjson.dumps(SGLANG_LOADS))
    assert isinstance(load, EngineLoad) and load.kv_usage == pytest.approx(0.3)
    assert load == EngineLoad(
        running=10, waiting=2, kv_usage=load.kv_usage, max_running=128, capacity_tokens=500000
    )


def test_sglang_and_trtllm_prometheus_forms() -> None:
    sglang = b'sglang:num_running_reqs{dp_rank="0"} 2\nsglang:num_queue_reqs{dp_rank="0"} 1\nsglang:token_usage 0.5\n'
    trtllm = (
        b"trtllm_num_requests_running 4\ntrtllm_num_requests_waiting 3\ntrtllm_kv_cache_utilization 0.6\n"
        b"trtllm_kv_cache_tokens_per_block 32\ntrtllm_kv_cache_max_blocks 100\n"
    )
    assert parse_load(EngineKind.SGLANG, "prometheus", sglang) == EngineLoad(
        running=2, waiting=1, kv_usage=0.5
    )
    assert parse_load(EngineKind.TRTLLM, "prometheus", trtllm) == EngineLoad(
        running=4, waiting=3, kv_usage=0.6, block_size=32, capacity_tokens=3200
    )


def test_trtllm_takes_the_newest_iteration() -> None:
    stats = [trtllm_stat(42, active=5, queued=2, paused=1, used=250), trtllm_stat(41, active=1, queued=0)]
    load = _parse(EngineKind.TRTLLM, orjson.dumps(stats))
    assert load == EngineLoad(
        running=5, waiting=3, kv_usage=0.25, max_running=256, block_size=32, capacity_tokens=32000
    )


def test_trtllm_entries_queued_as_json_strings() -> None:
    body = orjson.dumps([orjson.dumps(trtllm_stat(7, active=2, queued=0)).decode()])
    load = _parse(EngineKind.TRTLLM, body)
    assert isinstance(load, EngineLoad) and load.running == 2


def test_trtllm_empty_drain_keeps_the_previous_figures() -> None:
    assert _parse(EngineKind.TRTLLM, b"[]") == NoLoad(
        "no new iteration stats since the last read", keep_previous=True
    )


def test_kvgate_load() -> None:
    body = orjson.dumps(
        {"running": 2, "waiting": 1, "kv_usage": 1.7, "num_cached_blocks": 7, "max_running": 8}
    )
    load = _parse(EngineKind.KVGATE, body)
    assert load == EngineLoad(running=2, waiting=1, kv_usage=1.0, max_running=8, cached_blocks=7)


def test_engines_without_a_signal_say_so() -> None:
    for kind in (EngineKind.MII, EngineKind.OPENAI):
        profile = PROFILES[kind]
        assert profile.load_path is None
        assert parse_load(kind, profile.load_format, b"") == NoLoad(f"{kind} publishes no load signal")


@pytest.mark.parametrize(
    ("kind", "body", "reason"),
    [
        (EngineKind.VLLM, b'vllm:num_requests_running{engine="0" oops\n', "malformed Prometheus text"),
        (EngineKind.VLLM, b"vllm:num_requests_running not-a-number\n", "malformed Prometheus text"),
        (EngineKind.VLLM, b"<html>502 Bad Gateway</html>", "absent from the metrics"),
        (EngineKind.VLLM, b"\xff\xfe\x00garbage", "absent from the metrics"),
        (EngineKind.TGI, b"", "absent from the metrics"),
        (EngineKind.KVGATE, b"not json", "not JSON"),
        (EngineKind.KVGATE, b"[1, 2]", "not a JSON object"),
        (EngineKind.SGLANG, b'{"loads": "many"}', "no 'loads' entries"),
        (EngineKind.SGLANG, b"null", "no 'loads' entries"),
        (EngineKind.TRTLLM, b'{"iter": 1}', "not a JSON list"),
        (EngineKind.TRTLLM, b'[1, "{", null]', "not JSON objects"),
    ],
)
def test_malformed_input_never_raises(kind: EngineKind, body: bytes, reason: str) -> None:
    result = _parse(kind, body)
    assert isinstance(result, NoLoad)
    assert reason in result.reason
    assert not result.keep_previous


def test_non_numeric_and_nan_values_are_ignored() -> None:
    text = b"vllm:num_requests_running NaN\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc +Inf\n"
    assert _parse(EngineKind.VLLM, text) == EngineLoad(running=0, waiting=2, kv_usage=None)
    body = orjson.dumps({"loads": [{"num_running_reqs": "3", "num_waiting_reqs": True, "token_usage": None}]})
    assert _parse(EngineKind.SGLANG, body) == EngineLoad(running=0, waiting=0, kv_usage=None)


def test_only_the_needed_families_are_parsed() -> None:
    noise = b"".join(b'http_requests_total{handler="/x%d"} %d\n' % (i, i) for i in range(2000))
    broken = b'python_gc_objects_collected_total{generation="0" 12 x y\n'  # a family nobody reads
    load = _parse(EngineKind.VLLM, noise + broken + VLLM_METRICS_DP2)
    assert isinstance(load, EngineLoad) and (load.running, load.waiting) == (5, 5)


def test_an_older_sglangs_get_load_sums_its_ranks() -> None:
    body = b'[{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 10}, {"dp_rank": 1, "num_reqs": 1}]'
    assert parse_load(EngineKind.SGLANG, "sglang_get_load", body) == EngineLoad(running=4, waiting=2)
    one = b'{"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 1, "num_pages": 4}'  # some releases: one object
    assert parse_load(EngineKind.SGLANG, "sglang_get_load", one) == EngineLoad(running=2, waiting=1)
    assert isinstance(parse_load(EngineKind.SGLANG, "sglang_get_load", b'{"load": 3}'), NoLoad)
    assert isinstance(parse_load(EngineKind.SGLANG, "sglang_get_load", b"[]"), NoLoad)

"""The offline ideal hit rate (one LRU cache of the fleet's capacity) and the bench's bookkeeping."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint
from loadtest.bench_routing import (
    CASES,
    DEFAULT_CASES,
    PEER_TUNED_ARGS,
    SCENARIOS,
    _fleet_spec,
    _workload,
    imbalance,
    outside_ttfts,
    peer_case,
    replica_lag_quantile,
    router_case,
    sent_in_order,
    upstream_ttft_mean,
    worker_ttfts,
)
from loadtest.driver import RequestRecord
from loadtest.ideal_cache import PromptBlocks, ideal_replay, prompt_blocks
from loadtest.router_cmd import parse_router_cmd
from loadtest.workloads import Session, WorkRequest

BS = 4


def blocks(tokens: list[int], output: int = 0) -> PromptBlocks:
    return PromptBlocks(len(tokens), tuple(chain_hashes(tokens, root_hash("m"), BS)), output)


A = list(range(9))  # two full blocks and one token
B = list(range(100, 112))  # three full blocks, shares nothing with A


def test_repeats_hit_their_full_blocks_leaving_one_token_to_compute() -> None:
    # A: cold. A again: both full blocks (8 of 9 tokens). A[:8]: one block only, as the engine must
    # compute the last prompt token. 12 of 26 prompt tokens.
    res = ideal_replay([blocks(A), blocks(A), blocks(A[:8])], capacity_tokens=12 * BS, block_size=BS)
    assert (res.requests, res.prompt_tokens, res.hit_tokens, res.skipped) == (3, 26, 12, 0)
    assert res.hit_rate == pytest.approx(12 / 26)


def test_capacity_bounds_the_hits_lru() -> None:
    seq = [blocks(A), blocks(B), blocks(A)]
    # Three blocks: B takes every block, A's prefix is gone when A returns.
    assert ideal_replay(seq, capacity_tokens=3 * BS, block_size=BS).hit_tokens == 0
    # Six blocks: A's two blocks survive B.
    assert ideal_replay(seq, capacity_tokens=6 * BS, block_size=BS).hit_tokens == 8


def test_output_tokens_take_cache_space() -> None:
    # Four blocks. A takes 3 and frees them tail first, so A's first block is the most recently freed.
    # B alone takes the spare block, A's partial block and A's second block: A's first block survives.
    seq = [blocks(A), blocks(B), blocks(A)]
    assert ideal_replay(seq, capacity_tokens=4 * BS, block_size=BS).hit_tokens == 4
    # B with 4 output tokens needs a fourth block: A's first block goes too.
    seq = [blocks(A), blocks(B, output=4), blocks(A)]
    assert ideal_replay(seq, capacity_tokens=4 * BS, block_size=BS).hit_tokens == 0


def test_a_prompt_larger_than_the_cache_is_a_miss() -> None:
    res = ideal_replay([blocks(B), blocks(B)], capacity_tokens=2 * BS, block_size=BS)
    assert (res.prompt_tokens, res.hit_tokens, res.skipped) == (24, 0, 2)
    with pytest.raises(ValueError):
        ideal_replay([], capacity_tokens=BS - 1, block_size=BS)


def test_prompt_blocks_hash_what_the_gateway_hashes() -> None:
    bundle = byte_bundle()
    body = {"model": "kvgate-sim", "messages": [{"role": "user", "content": "hello " * 20}], "max_tokens": 3}
    seen = TokenizingAnalyzer(bundle, block_size=16).analyze(body, Endpoint.CHAT, "kvgate-sim")
    got = prompt_blocks(body, Endpoint.CHAT, bundle)
    assert (got.num_tokens, got.block_hashes, got.output_tokens) == (seen.num_tokens, seen.block_hashes, 3)
    ids = np.arange(40, dtype=np.uint32)
    got = prompt_blocks({"model": "m", "prompt": ids}, Endpoint.COMPLETIONS, bundle, output_tokens=5)
    assert got.block_hashes == tuple(chain_hashes(ids.tolist(), root_hash("m"), 16))
    assert (got.num_tokens, got.output_tokens) == (40, 5)


def test_sent_in_order_maps_each_sessions_records_to_its_turns() -> None:
    def chat(text: str) -> WorkRequest:
        return WorkRequest("chat", {"model": "m", "messages": [{"role": "user", "content": text}]})

    sessions = [Session("s1", (chat("a" * 40), chat("b" * 50))), Session("s2", (chat("c" * 60),))]
    recs = [
        RequestRecord("s1", start_s=2.0, completion_tokens=7),
        RequestRecord("s2", start_s=1.0, completion_tokens=2),
        RequestRecord("s1", start_s=0.5, completion_tokens=1),
    ]
    bundle = byte_bundle()
    got = sent_in_order(sessions, recs)
    want = [
        prompt_blocks(sessions[0].requests[0].body, Endpoint.CHAT, bundle, output_tokens=1),
        prompt_blocks(sessions[1].requests[0].body, Endpoint.CHAT, bundle, output_tokens=2),
        prompt_blocks(sessions[0].requests[1].body, Endpoint.CHAT, bundle, output_tokens=7),
    ]
    assert got == want


def test_imbalance_counts_idle_workers() -> None:
    recs = [
        RequestRecord("s", 0.0, prompt_tokens=30, worker="w1"),
        RequestRecord("s", 0.0, prompt_tokens=10, worker="w2"),
    ]
    assert imbalance(recs, 2, lambda r: r.prompt_tokens) == pytest.approx(1.5)
    assert imbalance(recs, 4, lambda r: r.prompt_tokens) == pytest.approx(3.0)


def test_worker_ttfts_queue_each_workers_uncached_prefill_in_send_order() -> None:
    recs = [
        RequestRecord("s1", 0.0, prompt_tokens=2000, cached_tokens=0, worker="w1"),  # 0.1 s of prefill
        RequestRecord("s2", 0.05, prompt_tokens=2000, cached_tokens=1000, worker="w1"),  # waits 0.05 s
        RequestRecord("s3", 0.05, prompt_tokens=2000, cached_tokens=0, worker="w2"),  # another worker
        RequestRecord("s4", 0.06, prompt_tokens=2000, worker="w2", error="boom"),  # failed: not served
    ]
    assert worker_ttfts(recs, prefill_tps=20_000) == pytest.approx([0.1, 0.1, 0.1])


def test_outside_ttfts_are_each_ttft_less_its_modelled_queue_and_prefill() -> None:
    recs = [
        RequestRecord("s1", 0.0, ttft_s=0.104, prompt_tokens=2000, worker="w1"),  # modelled 0.1 s
        RequestRecord("s2", 0.05, ttft_s=0.2, prompt_tokens=2000, cached_tokens=1000, worker="w1"),  # 0.1 s
        RequestRecord("s3", 0.01, ttft_s=None, prompt_tokens=20, worker="w2", error="boom"),  # not served
    ]
    assert outside_ttfts(recs, prefill_tps=20_000) == pytest.approx([0.004, 0.1])


def test_the_first_gateway_only_case_is_a_diagnosis_not_a_default() -> None:
    case = CASES["pca_x4_first"]
    assert case.gateways == 4 and case.drive_first_only and not CASES["pca_x4"].drive_first_only
    assert "pca_x4_first" not in DEFAULT_CASES and "pca_x4" in DEFAULT_CASES
    assert case.slug("trace") != CASES["pca_x4"].slug("trace")  # their records do not overwrite each other


def test_a_peer_case_runs_the_preset_in_kvgates_place(tmp_path: Path) -> None:
    tuned = peer_case("vllm-router:cache_aware:tuned", Path("/venv"))
    assert tuned.label == "vllm-router cache_aware (tuned)" and tuned.router_cmd is not None
    assert tuned.router_cmd.startswith("/venv/bin/vllm-router ") and tuned.router_cmd.endswith(
        PEER_TUNED_ARGS
    )
    assert (
        "{port}" in tuned.router_cmd and "{metrics_port}" not in tuned.router_cmd
    )  # given a port of its own
    plain = peer_case("vllm-router:cache_aware", Path("/venv"))
    assert PEER_TUNED_ARGS not in (plain.router_cmd or "") and plain.slug("x") != tuned.slug("x")
    with pytest.raises(ValueError, match="known peers"):
        peer_case("nginx", Path("/venv"))
    other = router_case(
        parse_router_cmd("before=/old/kvgate --port {port} --metrics {metrics_port} {workers}")
    )
    assert (
        other.label == "before" and other.router_cmd is not None and "{metrics_port}" not in other.router_cmd
    )
    scenario = SCENARIOS["chat_closed"]
    _, workers = _workload(replace(scenario, sessions=lambda _quick: []), True, foreign=True)
    spec = _fleet_spec(scenario, tuned, tmp_path, None, workers)
    assert spec.router_cmd == tuned.router_cmd and spec.policy is None and spec.workers == 4


def test_chat_closed_on_the_foreign_fleet_announces_no_capacity(tmp_path: Path) -> None:
    """The case of a sidecar in front of engines that say nothing: no ``#kv_tokens=`` unless asked."""
    scenario = SCENARIOS["chat_closed"]
    assert (scenario.rate, scenario.concurrency, scenario.workers) == (None, 32, 4)
    _, workers = _workload(replace(scenario, sessions=lambda _quick: []), True, foreign=True)
    assert _fleet_spec(scenario, CASES["pca"], tmp_path, None, workers).worker_fragment == ""
    told = _fleet_spec(replace(scenario, announce=True), CASES["pca"], tmp_path, None, workers)
    assert told.worker_fragment == f"kv_tokens={workers.kv_tokens}"


def test_upstream_ttft_mean_pools_every_route_of_every_gateway() -> None:
    one = (
        "# HELP kvgate_ttfb_seconds Time to first upstream byte\n"
        'kvgate_ttfb_seconds_bucket{route="completions",le="0.01"} 2.0\n'
        'kvgate_ttfb_seconds_count{route="completions"} 3.0\n'
        'kvgate_ttfb_seconds_sum{route="completions"} 0.06\n'
        'kvgate_ttfb_seconds_count{route="chat"} 1.0\n'
        'kvgate_ttfb_seconds_sum{route="chat"} 0.02\n'
        'kvgate_stage_seconds_sum{stage="policy"} 9.0\n'
    )
    two = 'kvgate_ttfb_seconds_count{route="completions"} 4.0\nkvgate_ttfb_seconds_sum{route="completions"} 0.12\n'
    assert upstream_ttft_mean([one, two]) == pytest.approx((0.06 + 0.02 + 0.12) / 8)
    assert math.isnan(upstream_ttft_mean(["kvgate_ttfb_seconds_count 0.0\n", ""]))


def test_replica_lag_quantiles_pool_every_gateway_and_interpolate_in_a_bucket() -> None:
    from gateway.observability.metrics import Metrics
    from gateway.state.lag import LagRecorder

    pages = []
    for lags in ((0.004, 0.004), (0.008, 0.009)):  # two gateways' load lags; no predictions anywhere
        recorder = LagRecorder()
        for seconds in lags:
            recorder.observe(seconds)
        metrics = Metrics()
        metrics.attach_replica_lag({"load": recorder, "prediction": LagRecorder()})
        pages.append(metrics.render().decode())
    # four observations: two in (3, 5] ms, two in (7.5, 10] ms
    assert replica_lag_quantile(pages, "load", 0.5) == pytest.approx(0.005)
    assert replica_lag_quantile(pages, "load", 0.25) == pytest.approx(0.004)  # half-way into (3, 5]
    assert replica_lag_quantile(pages, "load", 1.0) == pytest.approx(0.01)
    assert math.isnan(replica_lag_quantile(pages, "prediction", 0.5))
    assert math.isnan(replica_lag_quantile(["kvgate_ttfb_seconds_count 0.0\n"], "load", 0.5))
    recorder = LagRecorder()
    recorder.observe(9.0)  # above the last bound: the last bound is all a histogram says
    metrics = Metrics()
    metrics.attach_replica_lag({"load": recorder})
    assert replica_lag_quantile([metrics.render().decode()], "load", 0.5) == 5.0

"""prefix_cache_aware: the TTFT cost model prefers warm workers, moves off overloaded ones, credits tiers."""

from __future__ import annotations

import random
from typing import Any

import pytest

from policies import PolicyContext, RouteRequest, WorkerId, WorkerView, build_policy
from policies.builtin.prefix_cache_aware import CacheCostParams, LoadHistory, ttft_costs
from tests.unit.policies.fleets import worker

BS = 16
BLOCKS = 64  # a 1024-token prompt
REQ = RouteRequest(model="m", num_prompt_tokens=BLOCKS * BS, block_hashes=tuple(range(BLOCKS)))


def _pick(fleet: list[WorkerView], seed: int = 0, **params: object) -> str | None:
    spec = {"type": "prefix_cache_aware", "params": params}
    return build_policy(spec, PolicyContext(rng=random.Random(seed), block_size=BS)).select(REQ, fleet).worker


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ([worker("cold"), worker("warm", gpu_hit_blocks=60)], "warm"),
        ([worker("cold"), worker("warm", gpu_hit_blocks=60, inflight_tokens=500)], "warm"),
        ([worker("cold"), worker("warm", gpu_hit_blocks=60, inflight_tokens=3000)], "cold"),
        ([worker("cold"), worker("warm", gpu_hit_blocks=60, queue_depth=20)], "cold"),
        ([worker("cold"), worker("tier", tier_hit_blocks=64)], "tier"),
        ([worker("gpu", gpu_hit_blocks=32), worker("tier", tier_hit_blocks=64)], "tier"),
        ([worker("gpu", gpu_hit_blocks=64), worker("tier", tier_hit_blocks=64)], "gpu"),
        ([worker("half", gpu_hit_blocks=32), worker("most", gpu_hit_blocks=48)], "most"),
    ],
    ids=[
        "prefers_warm_worker",
        "warm_worker_worth_a_short_queue",
        "moves_off_worker_whose_queue_costs_more_than_the_hit_saves",
        "queue_depth_counts_as_backlog",
        "credits_tier_hits",
        "full_tier_hit_beats_partial_gpu_hit",
        "gpu_hit_beats_tier_hit",
        "longer_prefix_wins",
    ],
)
def test_cost_model_choices(fleet: list[WorkerView], expected: str) -> None:
    assert _pick(fleet) == expected


def test_hotspot_guard_copies_a_hot_prefix_to_a_second_worker() -> None:
    # The warm worker's backlog (12k tokens) is under its cache credit only because the prompt is huge;
    # it is far above the fleet mean, so the guard drops its credit and a cold worker wins.
    big = RouteRequest(model="m", num_prompt_tokens=20_000, block_hashes=tuple(range(1250)))
    fleet = [worker("hot", gpu_hit_blocks=1250, inflight_tokens=12_000), worker("c1"), worker("c2")]
    ctx = PolicyContext(block_size=BS)
    assert build_policy("prefix_cache_aware", ctx).select(big, fleet).worker in {"c1", "c2"}
    no_guard = {"type": "prefix_cache_aware", "params": {"hotspot_margin": 100.0}}
    assert build_policy(no_guard, ctx).select(big, fleet).worker == "hot"


def test_costs_are_backlog_plus_uncached_plus_discounted_pulls() -> None:
    p = CacheCostParams(tier_pull_cost=0.25, queued_request_tokens=100, hotspot_margin=1e9)
    fleet = [worker("a", inflight_tokens=200, queue_depth=2, gpu_hit_blocks=16, tier_hit_blocks=32)]
    costs = ttft_costs(REQ, fleet, p, BS)
    backlog, gpu, tier = 200 + 2 * 100, 16 * BS, 32 * BS
    assert costs[WorkerId("a")] == pytest.approx(backlog + (BLOCKS * BS - gpu - tier) + 0.25 * tier + 1.0)


def test_hit_counts_beyond_the_prompt_are_capped() -> None:
    p = CacheCostParams()
    costs = ttft_costs(REQ, [worker("a", gpu_hit_blocks=999, tier_hit_blocks=999)], p, BS)
    assert costs[WorkerId("a")] == pytest.approx(1.0)


def test_scores_put_the_chosen_worker_at_one() -> None:
    ctx = PolicyContext(block_size=BS)
    decision = build_policy("prefix_cache_aware", ctx).select(
        REQ, [worker("a"), worker("b", gpu_hit_blocks=64)]
    )
    assert decision.scores[WorkerId("b")] == 1.0
    assert 0.0 < decision.scores[WorkerId("a")] < 1.0
    assert "TTFT" in decision.reason


def test_ties_are_broken_by_the_seed_not_the_order() -> None:
    fleet = [worker(f"w{i}", gpu_hit_blocks=10) for i in range(4)]
    assert len({_pick(fleet, seed=s) for s in range(30)}) > 1


@pytest.mark.parametrize(
    "params",
    [
        {"tier_pull_cost": 2.0},
        {"prefill_tokens_per_s": 0},
        {"hotspot_margin": -1},
        {"balance_weight": -1},
        {"inflight_weight": 2.0},
        {"balance_half_life_s": 0},
        {"bogus": 1},
    ],
    ids=[
        "pull_cost_above_one",
        "zero_rate",
        "negative_margin",
        "negative_balance",
        "inflight_weight_above_one",
        "zero_half_life",
        "unknown_key",
    ],
)
def test_bad_params_stop_startup(params: dict[str, Any]) -> None:
    from policies import PolicyConfigError

    with pytest.raises(PolicyConfigError):
        build_policy({"type": "prefix_cache_aware", "params": params}, PolicyContext())


def _history(policy: Any, now: list[float], loads: dict[str, int], seconds: int) -> None:
    """Let ``policy`` see these in-flight tokens once a second for ``seconds`` (fake clock)."""
    fleet = [worker(w, inflight_tokens=t) for w, t in loads.items()]
    for _ in range(seconds):
        now[0] += 1.0
        policy.select(REQ, fleet)


def _policy(now: list[float], **params: object) -> Any:
    ctx = PolicyContext(rng=random.Random(0), block_size=BS, clock=lambda: now[0])
    return build_policy({"type": "prefix_cache_aware", "params": params}, ctx)


def test_cold_requests_go_to_the_least_loaded_worker_over_time() -> None:
    now = [0.0]
    policy = _policy(now)
    _history(policy, now, {"a": 2000, "b": 2000, "c": 500}, seconds=60)
    # Idle now, nothing cached: the bare cost model would draw at random; the history says "c".
    assert policy.select(REQ, [worker("a"), worker("b"), worker("c")]).worker == "c"


def test_new_sessions_leave_a_busy_warm_worker_but_deep_ones_stay() -> None:
    now = [0.0]
    policy = _policy(now)
    # "a" carried 20% more than the mean for minutes: charged about 3 * 0.2 * 1024 = 614 tokens.
    _history(policy, now, {"a": 1200, "b": 800}, seconds=300)
    shared_system_prompt = [worker("a", gpu_hit_blocks=16), worker("b")]  # saves 256 tokens on "a"
    assert policy.select(REQ, shared_system_prompt).worker == "b"
    deep_history = [worker("a", gpu_hit_blocks=63), worker("b")]  # saves 1008 tokens on "a"
    assert policy.select(REQ, deep_history).worker == "a"


def test_balance_weight_zero_is_the_bare_cost_model() -> None:
    now = [0.0]
    policy = _policy(now, balance_weight=0.0)
    _history(policy, now, {"a": 5000, "b": 0}, seconds=60)
    assert policy.select(REQ, [worker("a", gpu_hit_blocks=16), worker("b")]).worker == "a"


def test_load_history_is_a_time_weighted_average_with_a_half_life() -> None:
    now = [0.0]
    history = LoadHistory(half_life_s=10.0, clock=lambda: now[0])
    assert list(history.observe([worker("a", inflight_tokens=800)], 100).load) == [0.0]  # no history yet
    now[0] = 10.0  # one half-life on, the sample weighs half
    first = history.observe([worker("a", inflight_tokens=800)], 100)
    assert list(first.load) == pytest.approx([400.0])
    now[0] = 20.0
    later = history.observe([worker("a", inflight_tokens=0), worker("new", inflight_tokens=60)], 300)
    assert list(later.load) == pytest.approx([200.0, 30.0])
    assert later.mean_prompt == pytest.approx((100 + (300 - 100) / 2) * 0.75)  # 2 half-lives: 3/4 there


def test_inflight_weight_discounts_in_flight_tokens() -> None:
    # 3000 in-flight tokens outweigh the 960 the warm worker saves; a quarter of them (750) do not.
    fleet = [worker("cold"), worker("warm", gpu_hit_blocks=60, inflight_tokens=3000)]
    assert _pick(fleet) == "cold"
    assert _pick(fleet, inflight_weight=0.25) == "warm"

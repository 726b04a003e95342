"""prefix_cache_aware: the TTFT cost model prefers warm workers, moves off overloaded ones, credits tiers."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from policies import PolicyContext, RouteRequest, WorkerId, WorkerView, build_policy
from policies.builtin.prefix_cache_aware import CacheCostParams, Recent, ttft_costs
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
        ([worker("cold"), worker("warm", gpu_hit_blocks=60, inflight_tokens=3000)], "warm"),
        ([worker("cold"), worker("warm", gpu_hit_blocks=60, inflight_tokens=5000)], "cold"),
        ([worker("cold"), worker("warm", gpu_hit_blocks=60, queue_depth=20)], "cold"),
        ([worker("cold"), worker("tier", tier_hit_blocks=64)], "tier"),
        ([worker("gpu", gpu_hit_blocks=32), worker("tier", tier_hit_blocks=64)], "tier"),
        ([worker("gpu", gpu_hit_blocks=64), worker("tier", tier_hit_blocks=64)], "gpu"),
        ([worker("half", gpu_hit_blocks=32), worker("most", gpu_hit_blocks=48)], "most"),
    ],
    ids=[
        "prefers_warm_worker",
        "warm_worker_worth_a_short_queue",
        "warm_worker_worth_a_quarter_of_its_in_flight_tokens",
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
    # The warm worker's backlog (12k tokens: a quarter of 48k in flight) is under its cache credit only because the prompt is huge;
    # it is far above the fleet mean, so the guard drops its credit and a cold worker wins.
    big = RouteRequest(model="m", num_prompt_tokens=20_000, block_hashes=tuple(range(1250)))
    fleet = [worker("hot", gpu_hit_blocks=1250, inflight_tokens=48_000), worker("c1"), worker("c2")]
    ctx = PolicyContext(block_size=BS)
    assert build_policy("prefix_cache_aware", ctx).select(big, fleet).worker in {"c1", "c2"}
    no_guard = {"type": "prefix_cache_aware", "params": {"hotspot_margin": 100.0}}
    assert build_policy(no_guard, ctx).select(big, fleet).worker == "hot"


def test_costs_are_backlog_plus_uncached_plus_discounted_pulls() -> None:
    p = CacheCostParams(
        tier_pull_cost=0.25, queued_request_tokens=100, inflight_weight=0.5, hotspot_margin=1e9
    )
    fleet = [worker("a", inflight_tokens=200, queue_depth=2, gpu_hit_blocks=16, tier_hit_blocks=32)]
    costs = ttft_costs(REQ, fleet, p, BS)
    backlog, gpu, tier = 0.5 * 200 + 2 * 100, 16 * BS, 32 * BS
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
        {"cached_load_weight": 1.5},
        {"load_bound": 0.9},
        {"bound_slack_prompts": -1},
        {"overload_weight": -1},
        {"near_tie_requests": -0.1},
        {"bogus": 1},
    ],
    ids=[
        "pull_cost_above_one",
        "zero_rate",
        "negative_margin",
        "negative_balance",
        "inflight_weight_above_one",
        "cached_load_weight_above_one",
        "bound_below_one",
        "negative_slack",
        "negative_overload_weight",
        "negative_near_tie",
        "unknown_key",
    ],
)
def test_bad_params_stop_startup(params: dict[str, Any]) -> None:
    from policies import PolicyConfigError

    with pytest.raises(PolicyConfigError):
        build_policy({"type": "prefix_cache_aware", "params": params}, PolicyContext())


def _recent(loads: dict[str, float], mean_request: float = 1000.0, **hits: int) -> list[WorkerView]:
    """Views whose shared recent figures say each worker received ``loads`` tokens lately."""
    return [
        worker(w, recent_tokens=t, recent_requests=t / mean_request, gpu_hit_blocks=hits.get(w, 0))
        for w, t in loads.items()
    ]


def test_cold_requests_go_to_the_worker_that_received_least_lately() -> None:
    # Idle now, nothing cached: the bare cost model would draw at random; the recent load says "c".
    assert {_pick(_recent({"a": 60_000, "b": 60_000, "c": 15_000}), seed=s) for s in range(10)} == {"c"}


def test_a_shared_system_prompt_does_not_outweigh_balance_but_a_deep_session_does() -> None:
    # "b" received 20 mean requests less than "a": charged 1 * 1000 * 20k / (30k + 2k) = 625 tokens on "a"
    loads = {"a": 40_000, "b": 20_000}
    assert _pick(_recent(loads, a=8), load_bound=0.0) == "b"  # 128 tokens of system prompt on "a"
    assert _pick(_recent(loads, a=63), load_bound=0.0) == "a"  # 1008 of the 1024 tokens cached on "a"


def test_a_worker_past_the_load_bound_pays_for_it_and_its_cheap_hits_spill() -> None:
    loads = {"a": 180_000, "b": 100_000, "c": 100_000}  # "a" at 1.42x the mean
    fleet = _recent(loads, a=63)
    assert _pick(fleet, balance_weight=0.0) in {"b", "c"}  # the session spills and gets copied
    assert _pick(fleet, balance_weight=0.0, load_bound=0.0) == "a"
    assert _pick(fleet, balance_weight=0.0, load_bound=1.5) == "a"  # under a looser bound it stays
    assert _pick(fleet, balance_weight=0.0, overload_weight=0.0) == "a"
    # 34k tokens past the line cost 2.7 mean requests: a 1024-token hit spills, a 4096-token one stays
    big = RouteRequest(model="m", num_prompt_tokens=4096, block_hashes=tuple(range(256)))
    deep = _recent(loads, a=256)
    ctx = PolicyContext(rng=random.Random(0), block_size=BS)
    spec = {"type": "prefix_cache_aware", "params": {"balance_weight": 0.0}}
    assert build_policy(spec, ctx).select(big, deep).worker == "a"


def test_a_worker_whose_recent_load_is_mostly_cached_prompt_is_not_taken_for_overloaded() -> None:
    # "a" received 1.42x the mean in tokens, but 150k of its 180k were prompts it already held (deep
    # sessions): counted at 0.25, its work is 67.5k, under the mean, so its session stays on its cache.
    fleet = [
        worker(
            "a", recent_tokens=180_000, recent_requests=180, recent_cached_tokens=150_000, gpu_hit_blocks=63
        ),
        worker("b", recent_tokens=100_000, recent_requests=100),
        worker("c", recent_tokens=100_000, recent_requests=100),
    ]
    assert _pick(fleet, balance_weight=0.0) == "a"
    assert _pick(fleet, balance_weight=0.0, cached_load_weight=1.0) in {"b", "c"}  # routed tokens: it spills


def test_the_bound_leaves_a_young_fleet_room() -> None:
    # one request of history: "a" holds all of it (8x the mean), yet a session's next turn stays with it
    fleet = _recent({"a": 1100, "b": 0, "c": 0, "d": 0}, mean_request=1100, a=60)
    assert _pick(fleet, balance_weight=0.0) == "a"


def test_a_long_prompt_may_go_to_its_warm_worker_at_the_mean() -> None:
    big = RouteRequest(model="m", num_prompt_tokens=50_000, block_hashes=tuple(range(3125)))
    fleet = _recent({"a": 100_000, "b": 100_000}, a=3000)
    ctx = PolicyContext(rng=random.Random(0), block_size=BS)
    assert build_policy("prefix_cache_aware", ctx).select(big, fleet).worker == "a"


def test_near_ties_spread_cold_requests_but_never_a_warm_one() -> None:
    loads = {"a": 10_000, "b": 10_200, "c": 10_400, "d": 30_000}  # d is far from a near tie
    cold = _recent(loads)
    assert {_pick(cold, seed=s) for s in range(20)} == {"a"}  # greedy by default
    spread = {_pick(cold, seed=s, near_tie_requests=0.5) for s in range(40)}
    assert spread == {"a", "b", "c"}
    warm = _recent(loads, c=40)  # c saves 640 tokens: not a tie with the cold ones, whatever the spread
    assert {_pick(warm, seed=s, near_tie_requests=5.0) for s in range(20)} == {"c"}


def test_near_ties_and_home_workers_turn_on_by_themselves_while_other_replicas_route_the_fleet() -> None:
    cold = _recent({"a": 10_000, "b": 10_010, "c": 10_020, "d": 30_000})
    replicas = [1]
    ctx = [
        PolicyContext(
            rng=random.Random(s), block_size=BS, replicas=lambda: replicas[0], replica_rank=lambda s=s: s % 4
        )
        for s in range(40)
    ]
    policies = [build_policy("prefix_cache_aware", c) for c in ctx]
    assert {p.select(REQ, cold).worker for p in policies} == {"a"}  # a lone gateway is greedy
    replicas[0] = 4  # other replicas' figures appeared in the shared state
    picks = [p.select(REQ, cold).worker for p in policies]
    assert [w for i, w in enumerate(picks) if i % 4 < 3] == ["a", "b", "c"] * 10  # each its home worker
    # rank 3's home worker "d" costs far more than the cheapest: it draws among the near ties instead
    assert {w for i, w in enumerate(picks) if i % 4 == 3} == {"a", "b", "c"}
    off = {"type": "prefix_cache_aware", "params": {"near_tie_requests": 0, "replica_home_requests": 0}}
    assert {build_policy(off, c).select(REQ, cold).worker for c in ctx} == {"a"}  # set values win


def test_replicas_routing_a_burst_in_the_same_instant_spread_it_over_their_home_workers() -> None:
    idle = [worker(f"w{i}") for i in range(8)]  # what every replica sees before any sees the others' picks

    def replica(rank: int, **params: float) -> Any:
        ctx = PolicyContext(
            rng=random.Random(0), block_size=BS, replicas=lambda: 4, replica_rank=lambda: rank
        )
        return build_policy({"type": "prefix_cache_aware", "params": params}, ctx)

    assert len({replica(r).select(REQ, idle).worker for r in range(4)}) == 4
    # the same draw on every replica (one seed here) without home workers: all four pile onto one
    assert len({replica(r, replica_home_requests=0).select(REQ, idle).worker for r in range(4)}) == 1


def test_a_home_worker_takes_no_new_stream_its_young_streams_would_outweigh() -> None:
    # w1 is rank 1's home worker, within the home spread of the cheapest (w0) even with its stream cost,
    # but it received one more new stream lately, and a new stream brings two follow-ups here
    def fleet(follow_ups: float) -> list[WorkerView]:
        return [
            worker(
                "w0", recent_tokens=10_000, recent_requests=10, recent_streams=3, recent_follow_ups=follow_ups
            ),
            worker(
                "w1", recent_tokens=10_200, recent_requests=10, recent_streams=4, recent_follow_ups=follow_ups
            ),
        ]

    ctx = PolicyContext(block_size=BS, replicas=lambda: 2, replica_rank=lambda: 1)
    policy = build_policy("prefix_cache_aware", ctx)
    assert policy.select(REQ, fleet(follow_ups=7.0)).worker == "w0"
    assert policy.select(REQ, fleet(follow_ups=0.0)).worker == "w1"  # one-offs: the home rule holds
    off = build_policy({"type": "prefix_cache_aware", "params": {"stream_weight": 0}}, ctx)
    assert off.select(REQ, fleet(follow_ups=7.0)).worker == "w1"


def test_a_home_worker_never_takes_a_request_from_a_warmer_one() -> None:
    fleet = [worker("w0", gpu_hit_blocks=8), worker("w1")]  # w1 is rank 1's home worker; w0 holds more
    ctx = PolicyContext(block_size=BS, replicas=lambda: 2, replica_rank=lambda: 1)
    assert build_policy("prefix_cache_aware", ctx).select(REQ, fleet).worker == "w0"


def test_balance_weight_and_bound_zero_are_the_bare_cost_model() -> None:
    fleet = _recent({"a": 500_000, "b": 0}, a=16)
    assert _pick(fleet, balance_weight=0.0, load_bound=0.0) == "a"


def test_recent_is_read_from_the_views() -> None:
    recent = Recent.of(_recent({"a": 3000, "b": 1000}, mean_request=500))
    assert list(recent.load) == [3000, 1000] and recent.mean_request == pytest.approx(500)
    assert Recent.of([worker("a"), worker("b")]).mean_request == 0.0  # nothing routed yet: no term


def test_recent_counts_cached_prompt_tokens_at_their_weight_and_the_mean_request_in_full() -> None:
    fleet = [
        worker("a", recent_tokens=3000, recent_requests=2, recent_cached_tokens=2000),
        worker("b", recent_tokens=1000, recent_requests=2, recent_cached_tokens=5000),  # clamped to 1000
    ]
    recent = Recent.of(fleet, cached_weight=0.25)
    assert list(recent.load) == pytest.approx([3000 - 1500, 1000 - 750])
    assert recent.mean_request == pytest.approx(1000)  # every routed token: a request keeps its real size
    assert list(Recent.of(fleet).load) == [3000, 1000]  # weight 1: routed tokens


def test_balance_costs_are_zero_for_the_least_loaded_and_grow_with_the_excess() -> None:
    p = CacheCostParams(load_bound=0.0)
    fleet = [worker("a"), worker("b"), worker("c")]
    costs = ttft_costs(REQ, fleet, p, BS, Recent([0.0, 1000.0, 2000.0], mean_request=1000.0))
    a, b, c = (costs[WorkerId(w)] for w in "abc")
    assert a == pytest.approx(BLOCKS * BS + 1.0)
    assert b - a == pytest.approx(1.0 * 1000.0 * 1000.0 / (1000.0 + 2000.0))
    assert c - a == pytest.approx(2 * (b - a))


def test_inflight_weight_discounts_in_flight_tokens() -> None:
    # 3000 in-flight tokens counted in full outweigh the 960 the warm worker saves; by default a quarter
    # of them (750) count, and they do not.
    fleet = [worker("cold"), worker("warm", gpu_hit_blocks=60, inflight_tokens=3000)]
    assert _pick(fleet, inflight_weight=1.0) == "cold"
    assert _pick(fleet) == "warm"


def test_recent_reads_new_streams_and_follow_ups_per_stream() -> None:
    fleet = [
        worker("a", recent_streams=3, recent_follow_ups=20),
        worker("b", recent_streams=1, recent_follow_ups=4),
    ]
    recent = Recent.of(fleet)
    assert list(recent.streams) == [3, 1] and recent.follow_ups_per_stream == pytest.approx(6)
    young = Recent.of([worker("a", recent_streams=0.2, recent_follow_ups=3)])
    assert young.follow_ups_per_stream == pytest.approx(3)  # at least one stream: no blow-up when young


def _groups(streams: tuple[float, float], follow_ups: float) -> list[WorkerView]:
    # "quiet" received fewer tokens lately, but one more new stream (a young prefix group) than "even"
    return [
        worker("quiet", recent_tokens=20_000, recent_requests=20, recent_streams=streams[0],
               recent_follow_ups=follow_ups),
        worker("even", recent_tokens=24_000, recent_requests=24, recent_streams=streams[1],
               recent_follow_ups=follow_ups),
    ]  # fmt: skip


def test_a_new_stream_goes_where_fewer_young_streams_will_bring_their_follow_ups() -> None:
    fleet = _groups(streams=(5, 4), follow_ups=28)  # 7 follow-ups per new stream on this traffic
    assert _pick(fleet) == "even"
    assert _pick(fleet, stream_weight=0.0) == "quiet"  # recent tokens alone


def test_the_stream_term_fades_where_new_streams_bring_no_follow_ups() -> None:
    assert _pick(_groups(streams=(5, 4), follow_ups=0)) == "quiet"  # one-offs: balance on tokens


def test_a_follow_up_ignores_stream_counts() -> None:
    fleet = _groups(streams=(5, 4), follow_ups=28)
    warm = [fleet[0], dataclasses.replace(fleet[1], gpu_hit_blocks=4)]  # "even" holds a few blocks
    assert ttft_costs(REQ, warm, CacheCostParams(), BS, Recent.of(warm, 0.25)) == ttft_costs(
        REQ, warm, CacheCostParams(stream_weight=0.0), BS, Recent.of(warm, 0.25)
    )


def test_prompts_still_waiting_for_their_first_token_count_as_the_queue() -> None:
    """Where the gateway sees first tokens, pending prefill is work ahead and decoding tokens are not."""
    decoding = worker("decoding", gpu_hit_blocks=60, inflight_tokens=8_000, prefill_tokens=0)
    queued = worker("queued", gpu_hit_blocks=60, inflight_tokens=8_000, prefill_tokens=8_000)
    cold = worker("cold")
    # unknown: 8,000 in-flight tokens at a quarter cost more than the 960 cached tokens save
    assert _pick([dataclasses.replace(decoding, prefill_tokens=None), cold]) == "cold"
    assert _pick([decoding, cold]) == "decoding"  # known to be decoding: its cache wins
    assert _pick([queued, cold]) == "cold"  # known to be queued prefill
    assert _pick([decoding, cold], decoding_weight=1.0) == "cold"
    with pytest.raises(ValueError):
        CacheCostParams(prefill_weight=1.5).validate()

"""round_robin, random, least_load and power_of_two: table-driven behaviour checks."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from policies import Decision, PolicyContext, Role, RouteRequest, WorkerId, WorkerView, build_policy
from policies.builtin.round_robin import RoundRobin
from tests.unit.policies.fleets import worker

REQ = RouteRequest(model="m", num_prompt_tokens=100)


def _route(policy: RoundRobin, workers: list[WorkerView]) -> str | None:
    decision = policy.select(REQ, workers)
    policy.on_routed(REQ, decision)
    return decision.worker


def test_round_robin_cycles_in_id_order() -> None:
    rr = RoundRobin()
    fleet = [worker("c"), worker("a"), worker("b")]
    assert [_route(rr, fleet) for _ in range(5)] == ["a", "b", "c", "a", "b"]


def test_round_robin_keeps_its_place_when_a_worker_joins() -> None:
    rr = RoundRobin()
    assert [_route(rr, [worker("a"), worker("c")]) for _ in range(1)] == ["a"]
    assert _route(rr, [worker("a"), worker("b"), worker("c")]) == "b"


def test_round_robin_cursor_moves_only_when_routed() -> None:
    rr = RoundRobin()
    fleet = [worker("a"), worker("b")]
    assert {rr.select(REQ, fleet).worker for _ in range(3)} == {"a"}
    rr.on_routed(REQ, Decision(worker=None))
    assert rr.select(REQ, fleet).worker == "a"


@pytest.mark.parametrize(
    "fleet",
    [
        [worker("a", healthy=False), worker("b")],
        [worker("a", role=Role.PREFILL), worker("b")],
        [worker("a", role=Role.DECODE), worker("b")],
    ],
    ids=["skips_unhealthy", "skips_prefill_only", "skips_decode_only"],
)
@pytest.mark.parametrize("name", ["round_robin", "random", "least_load", "power_of_two"])
def test_simple_policies_only_use_healthy_both_workers(name: str, fleet: list[WorkerView]) -> None:
    policy = build_policy(name, PolicyContext(rng=random.Random(1)))
    assert {policy.select(REQ, fleet).worker for _ in range(20)} == {"b"}


def test_random_spreads_over_all_workers() -> None:
    policy = build_policy("random", PolicyContext(rng=random.Random(3)))
    fleet = [worker(f"w{i}") for i in range(4)]
    counts = Counter(policy.select(REQ, fleet).worker for _ in range(400))
    assert set(counts) == {"w0", "w1", "w2", "w3"}
    assert min(counts.values()) > 50


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ([worker("a", inflight_tokens=900), worker("b", inflight_tokens=100)], "b"),
        (
            [
                worker("a", inflight_tokens=100, inflight_requests=1, queue_depth=0),
                worker("b", inflight_tokens=100, inflight_requests=0, queue_depth=9),
            ],
            "b",
        ),
        (
            [
                worker("a", inflight_tokens=100, inflight_requests=5),
                worker("b", inflight_tokens=5000, inflight_requests=1),
            ],
            "a",
        ),
    ],
    ids=["fewest_inflight_tokens", "then_fewest_requests", "tokens_outrank_requests"],
)
def test_least_load_prefers_least_loaded(fleet: list[WorkerView], expected: str) -> None:
    policy = build_policy("least_load", PolicyContext())
    assert policy.select(REQ, fleet).worker == expected


def test_least_load_breaks_ties_with_seeded_draws() -> None:
    fleet = [worker(f"w{i}") for i in range(4)]
    picks = [
        build_policy("least_load", PolicyContext(rng=random.Random(s))).select(REQ, fleet).worker
        for s in range(40)
    ]
    assert len(set(picks)) > 1


def test_power_of_two_takes_the_less_loaded_of_its_draws() -> None:
    policy = build_policy("power_of_two", PolicyContext(rng=random.Random(5)))
    fleet = [worker("idle"), worker("busy", inflight_tokens=10_000)]
    assert {policy.select(REQ, fleet).worker for _ in range(20)} == {"idle"}


def test_power_of_two_never_picks_the_busiest_of_three() -> None:
    policy = build_policy("power_of_two", PolicyContext(rng=random.Random(6)))
    fleet = [worker("a", inflight_tokens=1), worker("b", inflight_tokens=2), worker("c", inflight_tokens=3)]
    picks = Counter(policy.select(REQ, fleet).worker for _ in range(300))
    assert "c" not in picks
    assert picks[WorkerId("a")] > picks[WorkerId("b")]

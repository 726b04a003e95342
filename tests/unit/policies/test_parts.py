"""Filters, scorers and pickers, one behaviour per test."""

from __future__ import annotations

import random
from typing import Any

import pytest

from policies import Kind, PluginSpec, PolicyContext, Role, RouteRequest, WorkerView, make_registry
from tests.unit.policies.fleets import worker

REQ = RouteRequest(model="m", num_prompt_tokens=160, block_hashes=tuple(range(10)))


def _part(kind: Kind, name: str, seed: int = 0, **params: object) -> Any:
    return make_registry([]).build_plugin(
        PluginSpec(name, name, params), kind, PolicyContext(rng=random.Random(seed))
    )


FLEET = [
    worker("a", healthy=False, queue_depth=1),
    worker("b", role=Role.PREFILL, queue_depth=50),
    worker("c", role=Role.DECODE, queue_depth=5),
    worker("d", queue_depth=40),
]


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("healthy", {}, ["b", "c", "d"]),
        ("role", {}, ["a", "d"]),
        ("role", {"roles": ["prefill", "decode"]}, ["b", "c"]),
        ("max_queue", {"max_queue_depth": 10}, ["a", "c"]),
        ("max_queue", {"max_queue_depth": 0}, ["a", "b", "c", "d"]),
        ("max_queue", {"max_queue_depth": 0, "strict": True}, []),
    ],
    ids=[
        "healthy",
        "role_default_both",
        "role_list",
        "max_queue",
        "max_queue_keeps_all_if_none_fit",
        "max_queue_strict",
    ],
)
def test_filters(name: str, params: dict[str, Any], expected: list[str]) -> None:
    assert [w.id for w in _part(Kind.FILTER, name, **params).filter(REQ, FLEET)] == expected


@pytest.mark.parametrize(
    ("name", "params", "fleet", "expected"),
    [
        (
            "prefix_hit",
            {},
            [worker("a", gpu_hit_blocks=5), worker("b", gpu_hit_blocks=10)],
            {"a": 0.5, "b": 1.0},
        ),
        ("prefix_hit", {"tier_weight": 0.5}, [worker("a", tier_hit_blocks=10)], {"a": 0.5}),
        (
            "queue_depth",
            {"saturation": 10},
            [worker("a", queue_depth=5), worker("b", queue_depth=99)],
            {"a": 0.5, "b": 0.0},
        ),
        (
            "inflight_tokens",
            {},
            [worker("a", inflight_tokens=50), worker("b", inflight_tokens=100)],
            {"a": 0.5, "b": 0.0},
        ),
        ("inflight_tokens", {}, [worker("a"), worker("b")], {"a": 1.0, "b": 1.0}),
        ("kv_usage", {}, [worker("a", kv_usage=0.25), worker("b", kv_usage=1.5)], {"a": 0.75, "b": 0.0}),
    ],
    ids=[
        "prefix_hit_share",
        "prefix_hit_discounts_tier",
        "queue_depth_saturates",
        "inflight_relative",
        "inflight_idle",
        "kv_usage",
    ],
)
def test_scorers(
    name: str, params: dict[str, Any], fleet: list[WorkerView], expected: dict[str, float]
) -> None:
    assert dict(_part(Kind.SCORER, name, **params).score(REQ, fleet)) == pytest.approx(expected)


def test_prefix_hit_scores_zero_without_block_hashes() -> None:
    scorer = _part(Kind.SCORER, "prefix_hit")
    assert scorer.score(RouteRequest(model="m"), [worker("a", gpu_hit_blocks=3)]) == {"a": 0.0}


def test_max_score_takes_the_best() -> None:
    scored = [(worker("a"), 0.2), (worker("b"), 0.9), (worker("c"), 0.5)]
    assert _part(Kind.PICKER, "max_score").pick(REQ, scored).id == "b"


def test_max_score_draws_among_ties_by_seed() -> None:
    scored = [(worker(f"w{i}"), 0.5) for i in range(4)]
    assert len({_part(Kind.PICKER, "max_score", seed=s).pick(REQ, scored).id for s in range(30)}) > 1


def test_weighted_random_follows_the_scores() -> None:
    picker = _part(Kind.PICKER, "weighted_random", seed=1)
    scored = [(worker("zero"), 0.0), (worker("low"), 0.1), (worker("high"), 0.9)]
    picks = [picker.pick(REQ, scored).id for _ in range(500)]
    assert "zero" not in picks
    assert picks.count("high") > 3 * picks.count("low") > 0


def test_weighted_random_is_uniform_when_all_scores_are_zero() -> None:
    picker = _part(Kind.PICKER, "weighted_random", seed=2)
    scored = [(worker("a"), 0.0), (worker("b"), 0.0)]
    assert {picker.pick(REQ, scored).id for _ in range(50)} == {"a", "b"}

"""One suite for every registered policy, filter, scorer and picker: built-ins and installed plugins.

The example plugin under ``examples/kvgate-example-policy`` joins the suite even when it is not installed.
Checks: never an unhealthy worker or one of the wrong role, an empty fleet gives no worker, scores stay in
[0, 1], inputs are not mutated, a fixed seed gives fixed decisions, and every input read is declared in
``needs`` (blanking an undeclared input must not change a decision).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata as md
import random
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from policies import (
    DECODE_ROLES,
    PREFILL_ROLES,
    SERVING_ROLES,
    Filter,
    Kind,
    Need,
    Observer,
    PluginSpec,
    Policy,
    PolicyContext,
    PolicyRegistry,
    Role,
    RouteRequest,
    Scorer,
    WorkerView,
    make_registry,
)
from tests.unit.policies.fleets import EXAMPLE_ENTRY_POINT, EXAMPLE_PLUGIN_DIR, random_fleet, random_request

ROUNDS = 60


@functools.cache
def _registry() -> PolicyRegistry:
    src = str(EXAMPLE_PLUGIN_DIR / "src")
    if src not in sys.path:
        sys.path.append(src)  # the example plugin, importable whether or not it is installed
    installed = [ep for ep in md.entry_points(group="kvgate.policies") if ep.name != EXAMPLE_ENTRY_POINT.name]
    return make_registry([*installed, EXAMPLE_ENTRY_POINT])


def _classify() -> dict[Kind, list[str]]:
    reg = _registry()
    kinds: dict[Kind, list[str]] = {k: [n for n in reg.names(k) if n != "pipeline"] for k in Kind}
    protocols: dict[Kind, type] = {Kind.POLICY: Policy, Kind.FILTER: Filter, Kind.SCORER: Scorer}
    for name in reg.third_party():
        plugin = reg.plugin(name)
        obj = plugin.factory(PolicyContext(), {})
        kind = next((k for k, proto in protocols.items() if isinstance(obj, proto)), Kind.PICKER)
        kinds[kind].append(name)
    return kinds


KINDS = _classify()
PIPELINES = {
    "pipeline_all_scorers": {
        "type": "pipeline",
        "filters": ["healthy", {"type": "max_queue", "params": {"max_queue_depth": 20}}],
        "scorers": [{"type": s, "weight": 1 + i} for i, s in enumerate(KINDS[Kind.SCORER])],
        "picker": "max_score",
    },
    "pipeline_weighted_random": {"type": "pipeline", "scorers": ["prefix_hit"], "picker": "weighted_random"},
}


def _policy_spec(name: str) -> Any:
    if name in PIPELINES:
        return PIPELINES[name]
    if name in KINDS[Kind.POLICY]:
        return name
    kind = next(k for k, names in KINDS.items() if name in names)
    part = {Kind.FILTER: "filters", Kind.SCORER: "scorers", Kind.PICKER: "picker"}[kind]
    return {"type": "pipeline", part: name if kind is Kind.PICKER else [name]}


POLICY_CASES = [
    *KINDS[Kind.POLICY],
    *PIPELINES,
    *(f"pipeline_with:{n}" for k in Kind if k is not Kind.POLICY for n in KINDS[k]),
]


def _build(case: str, seed: int = 7) -> Policy:
    name = case.removeprefix("pipeline_with:")
    return _registry().build(_policy_spec(name), PolicyContext(rng=random.Random(seed), clock=lambda: 100.0))


def _drive(policy: Policy, req: RouteRequest, fleet: Sequence[WorkerView]) -> tuple[Any, Any]:
    decision = policy.select(req, fleet)
    if isinstance(policy, Observer):
        policy.on_routed(req, decision)
    return decision.worker, decision.prefill_worker


def _cases(seed: int = 1) -> list[tuple[RouteRequest, list[WorkerView]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(ROUNDS):
        req = random_request(rng)
        out.append((req, random_fleet(rng, req)))
    return out


@pytest.mark.parametrize("case", POLICY_CASES)
def test_policy_never_picks_unhealthy_or_wrong_role(case: str) -> None:
    policy = _build(case)
    pd = getattr(policy, "disaggregates", False)
    for req, fleet in _cases():
        decision = policy.select(req, fleet)
        by_id = {w.id: w for w in fleet}
        if decision.worker is not None:
            chosen = by_id[decision.worker]
            assert chosen.healthy
            assert chosen.role in (DECODE_ROLES if pd else SERVING_ROLES)
        else:
            eligible = [w for w in fleet if w.healthy and w.role in (DECODE_ROLES if pd else SERVING_ROLES)]
            assert not eligible
        if decision.prefill_worker is not None:
            assert pd and decision.worker is not None
            assert by_id[decision.prefill_worker].healthy
            assert by_id[decision.prefill_worker].role in PREFILL_ROLES
            assert decision.prefill_worker != decision.worker


@pytest.mark.parametrize("case", POLICY_CASES)
def test_policy_answers_no_worker_for_empty_or_unusable_fleet(case: str) -> None:
    policy = _build(case)
    req = random_request(random.Random(3))
    unhealthy = [dataclasses.replace(w, healthy=False) for w in random_fleet(random.Random(4), req, size=5)]
    prefill_only = [
        dataclasses.replace(w, healthy=True, role=Role.PREFILL)
        for w in random_fleet(random.Random(5), req, size=4)
    ]
    assert policy.select(req, []).worker is None
    assert policy.select(req, unhealthy).worker is None
    assert policy.select(req, prefill_only).worker is None


@pytest.mark.parametrize("case", POLICY_CASES)
def test_policy_scores_stay_in_unit_interval(case: str) -> None:
    policy = _build(case)
    for req, fleet in _cases():
        scores = policy.select(req, fleet).scores
        assert all(0.0 <= s <= 1.0 for s in scores.values()), scores
        assert set(scores) <= {w.id for w in fleet}


@pytest.mark.parametrize("case", POLICY_CASES)
def test_policy_does_not_mutate_inputs(case: str) -> None:
    policy = _build(case)
    for req, fleet in _cases():
        req_before, fleet_before = dataclasses.replace(req), list(fleet)
        headers_before = dict(req.headers)
        _drive(policy, req, fleet)
        assert fleet == fleet_before
        assert req == req_before
        assert dict(req.headers) == headers_before


@pytest.mark.parametrize("case", POLICY_CASES)
def test_policy_is_deterministic_with_a_fixed_seed(case: str) -> None:
    first, second = _build(case, seed=11), _build(case, seed=11)
    cases = _cases(seed=2)
    assert [_drive(first, r, f) for r, f in cases] == [_drive(second, r, f) for r, f in cases]


def _blank_undeclared(needs: frozenset[Need], req: RouteRequest, fleet: list[WorkerView]) -> tuple[Any, Any]:
    if Need.TOKENS not in needs:
        req = dataclasses.replace(req, num_prompt_tokens=0)
    if Need.BLOCK_HASHES not in needs:
        req = dataclasses.replace(req, block_hashes=())
    if Need.PREFIX_HITS not in needs:
        fleet = [dataclasses.replace(w, gpu_hit_blocks=0, tier_hit_blocks=0) for w in fleet]
    return req, fleet


@pytest.mark.parametrize("case", POLICY_CASES)
def test_policy_declares_every_input_it_reads(case: str) -> None:
    needs = _build(case).needs
    assert needs <= set(Need)
    for req, fleet in _cases(seed=3):
        blank_req, blank_fleet = _blank_undeclared(needs, req, fleet)
        assert _build(case).select(req, fleet).worker == _build(case).select(blank_req, blank_fleet).worker


def _part(kind: Kind, name: str, seed: int = 7) -> Any:
    return _registry().build_plugin(PluginSpec(name, name), kind, PolicyContext(rng=random.Random(seed)))


@pytest.mark.parametrize("name", KINDS[Kind.FILTER])
def test_filter_returns_a_subsequence_and_handles_empty(name: str) -> None:
    flt = _part(Kind.FILTER, name)
    assert list(flt.filter(random_request(random.Random(0)), [])) == []
    for req, fleet in _cases():
        before = list(fleet)
        kept = list(flt.filter(req, fleet))
        assert fleet == before
        it = iter(fleet)
        assert all(any(k is w for w in it) for k in kept), "not a subsequence of the input"


@pytest.mark.parametrize("name", KINDS[Kind.SCORER])
def test_scorer_scores_every_worker_in_unit_interval(name: str) -> None:
    scorer = _part(Kind.SCORER, name)
    needs: frozenset[Need] = getattr(scorer, "needs", frozenset())
    assert not scorer.score(random_request(random.Random(0)), [])
    for req, fleet in _cases():
        before = list(fleet)
        scores = scorer.score(req, fleet)
        assert fleet == before
        assert set(scores) <= {w.id for w in fleet}
        assert all(0.0 <= s <= 1.0 for s in scores.values()), scores
        blank_req, blank_fleet = _blank_undeclared(needs, req, fleet)
        assert scorer.score(blank_req, blank_fleet) == scores


@pytest.mark.parametrize("name", KINDS[Kind.PICKER])
def test_picker_picks_a_scored_worker_deterministically(name: str) -> None:
    first, second = _part(Kind.PICKER, name, seed=5), _part(Kind.PICKER, name, seed=5)
    assert first.pick(random_request(random.Random(0)), []) is None
    rng = random.Random(9)
    for req, fleet in _cases():
        scored = [(w, rng.random()) for w in fleet]
        before = list(scored)
        a, b = first.pick(req, scored), second.pick(req, scored)
        assert scored == before
        assert a is b
        assert (a is None) == (not scored)
        assert a is None or any(a is w for w, _ in scored)


def test_suite_covers_every_builtin_and_the_example_plugin() -> None:
    covered = set(POLICY_CASES) | {n for names in KINDS.values() for n in names}
    for kind in Kind:
        assert set(_registry().names(kind)) - {"pipeline"} <= covered
    assert "lowest_id" in KINDS[Kind.POLICY]

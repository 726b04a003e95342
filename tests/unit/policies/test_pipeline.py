"""The pipeline: implicit guards, weights, clamping, needs and observer forwarding."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from policies import (
    Decision,
    Need,
    Outcome,
    Pipeline,
    PolicyContext,
    Role,
    RouteRequest,
    WorkerId,
    WorkerView,
    build_policy,
)
from policies.builtin.pickers import MaxScoreParams, MaxScorePicker
from tests.unit.policies.fleets import worker

REQ = RouteRequest(model="m", num_prompt_tokens=160, block_hashes=tuple(range(10)))


class Fixed:
    """A scorer returning fixed (possibly out-of-range) scores."""

    def __init__(self, name: str, scores: Mapping[str, float], needs: frozenset[Need] = frozenset()) -> None:
        self.name, self._scores, self.needs = name, scores, needs
        self.routed: list[Decision] = []
        self.finished: list[Outcome] = []

    def score(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Mapping[WorkerId, float]:
        return {w.id: self._scores[w.id] for w in workers if w.id in self._scores}

    def on_routed(self, req: RouteRequest, decision: Decision) -> None:
        self.routed.append(decision)

    def on_finished(self, outcome: Outcome) -> None:
        self.finished.append(outcome)


def _pipeline(*scorers: tuple[Fixed, float]) -> Pipeline:
    return Pipeline("p", [], list(scorers), MaxScorePicker(MaxScoreParams(), random.Random(0)))


def test_weights_decide_between_scorers() -> None:
    fleet = [worker("a"), worker("b")]
    likes_a, likes_b = Fixed("x", {"a": 1.0, "b": 0.0}), Fixed("y", {"a": 0.0, "b": 1.0})
    assert _pipeline((likes_a, 3.0), (likes_b, 1.0)).select(REQ, fleet).worker == "a"
    assert _pipeline((likes_a, 1.0), (likes_b, 3.0)).select(REQ, fleet).worker == "b"


def test_out_of_range_scores_are_clamped_and_missing_ids_count_zero() -> None:
    decision = _pipeline((Fixed("x", {"a": 7.0, "b": -3.0}), 1.0)).select(
        REQ, [worker("a"), worker("b"), worker("c")]
    )
    assert decision.scores == {"a": 1.0, "b": 0.0, "c": 0.0}


def test_combined_score_is_the_weighted_mean() -> None:
    p = _pipeline((Fixed("x", {"a": 1.0}), 1.0), (Fixed("y", {"a": 0.0}), 3.0))
    assert p.select(REQ, [worker("a")]).scores == {"a": 0.25}


def test_unhealthy_and_non_serving_workers_never_reach_the_scorers() -> None:
    fleet = [worker("sick", healthy=False), worker("pre", role=Role.PREFILL), worker("ok")]
    p = _pipeline((Fixed("x", {"sick": 1.0, "pre": 1.0, "ok": 0.0}), 1.0))
    decision = p.select(REQ, fleet)
    assert decision.worker == "ok"
    assert set(decision.scores) == {"ok"}


def test_needs_is_the_union_of_the_parts() -> None:
    p = _pipeline(
        (Fixed("x", {}, frozenset({Need.TOKENS})), 1.0), (Fixed("y", {}, frozenset({Need.PREFIX_HITS})), 1.0)
    )
    assert p.needs == {Need.TOKENS, Need.PREFIX_HITS}
    built = build_policy({"type": "pipeline", "scorers": ["queue_depth", "kv_usage"]}, PolicyContext())
    assert built.needs == frozenset()


def test_observer_hooks_reach_stateful_parts() -> None:
    part = Fixed("x", {"a": 1.0})
    p = _pipeline((part, 1.0))
    decision = p.select(REQ, [worker("a")])
    p.on_routed(REQ, decision)
    p.on_finished(Outcome(decision=decision, request=REQ, ok=True))
    assert part.routed == [decision]
    assert len(part.finished) == 1


def test_zero_weight_scorers_are_skipped() -> None:
    p = _pipeline((Fixed("x", {"a": 1.0, "b": 0.0}), 0.0), (Fixed("y", {"a": 0.0, "b": 1.0}), 1.0))
    assert p.select(REQ, [worker("a"), worker("b")]).worker == "b"


def test_default_picker_is_max_score() -> None:
    policy = build_policy({"type": "pipeline", "scorers": ["inflight_tokens"]}, PolicyContext())
    fleet = [worker("busy", inflight_tokens=100), worker("idle")]
    assert policy.select(REQ, fleet).worker == "idle"

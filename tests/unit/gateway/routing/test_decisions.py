"""The last routing decisions kept for the admin page, formatted only when asked."""

from __future__ import annotations

import pytest

from gateway.routing.decision_log import DecisionLog
from policies.api import Decision, Role, RouteRequest, WorkerId, WorkerView


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def _view(wid: str, hit_blocks: int = 0, healthy: bool = True) -> WorkerView:
    return WorkerView(
        id=WorkerId(wid), role=Role.BOTH, healthy=healthy, inflight_requests=1, inflight_tokens=0,
        queue_depth=2, kv_usage=0.0, gpu_hit_blocks=hit_blocks, tier_hit_blocks=0,
    )  # fmt: skip


def _request(tokens: int = 40, blocks: int = 3) -> RouteRequest:
    return RouteRequest(model="m", num_prompt_tokens=tokens, block_hashes=tuple(range(blocks)))


def test_newest_first_with_age_and_the_chosen_worker_leading_the_candidates() -> None:
    clock = Clock()
    log = DecisionLog(size=3, clock=clock)
    views = tuple(_view(w, hit) for w, hit in (("w0", 0), ("w1", 3), ("w2", 1), ("w3", 0), ("w4", 2)))
    scores = {WorkerId("w0"): 0.2, WorkerId("w1"): 0.9, WorkerId("w2"): 0.95, WorkerId("w4"): 0.5}
    decision = Decision(worker=WorkerId("w1"), scores=scores, reason="longest prefix")
    for _ in range(4):  # one more than kept
        log.add(_request(), decision, views)
        clock.now += 1.0
    log.add(_request(tokens=7), Decision(worker=WorkerId("w0"), reason="only one"), views, "w3")
    recent = log.recent(block_size=16, top=3)
    assert len(log) == 3 and len(recent) == 3
    assert [round(d.age_s) for d in recent] == [0, 1, 2]
    newest = recent[0]
    assert (newest.worker, newest.prefill_worker, newest.prompt_tokens, newest.reason) == (
        "w0",
        "w3",
        7,
        "only one",
    )
    older = recent[1]
    assert [c.id for c in older.candidates] == ["w1", "w2", "w4"]  # chosen, then by score
    assert older.candidates[0].hit_tokens == 40  # 3 blocks of 16, capped at the prompt
    assert older.candidates[1].score == 0.95 and older.candidates[1].queue == 2
    assert older.blocks == 3 and older.model == "m"
    assert [c.id for c in newest.candidates] == ["w0", "w1", "w4"]  # no scores: by predicted hit


def test_limit_and_size() -> None:
    log = DecisionLog(size=5, clock=Clock())
    for i in range(4):
        log.add(_request(tokens=i), Decision(worker=WorkerId("w0")), (_view("w0"),))
    assert [d.prompt_tokens for d in log.recent(16, limit=2)] == [3, 2]
    with pytest.raises(ValueError, match="positive"):
        DecisionLog(size=0)

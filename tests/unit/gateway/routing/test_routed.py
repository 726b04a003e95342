"""``Routed`` copies and ``Result`` values: what ``dataclasses.replace`` and a frozen dataclass gave before."""

from __future__ import annotations

import time

from gateway.fleet.breaker import CircuitBreaker
from gateway.fleet.registry import WorkerRecord
from gateway.openai.sse import TokenUsage
from gateway.proxy.result import Result
from gateway.routing.prefill_watch import Ticket
from gateway.routing.routed import Routed
from policies.api import Decision, Role, RouteRequest, WorkerId


def _record(worker: str) -> WorkerRecord:
    breaker = CircuitBreaker(failures=1, open_s=60.0, clock=time.monotonic)
    return WorkerRecord(id=worker, url=f"http://{worker}", role=Role.BOTH, breaker=breaker)


def test_a_failed_prefill_leaves_the_decode_worker_alone_with_everything_else_kept() -> None:
    decode, prefill, ticket = _record("d"), _record("p"), Ticket("d", 10, 20, 0.0)
    routed = Routed(
        RouteRequest(model="m"), Decision(worker=WorkerId("d")), decode, 16, prefill, 32, False, ticket
    )
    alone = routed.without_prefill()
    assert (routed.prefill_id, alone.prefill_id, alone.prefill) == ("p", None, None)
    assert (alone.request, alone.decision, alone.record) == (routed.request, routed.decision, decode)
    assert (alone.prefix_hit_tokens, alone.best_hit_tokens, alone.balanced, alone.ticket) == (
        16,
        32,
        False,
        ticket,
    )


def test_moving_a_request_drops_its_predicted_hit_and_marks_it_placed_by_load() -> None:
    routed = Routed(
        RouteRequest(model="m"), Decision(worker=WorkerId("a")), _record("a"), 16, best_hit_tokens=32
    )
    other = _record("b")
    moved = routed.moved_to(other)
    assert (moved.record, moved.prefix_hit_tokens, moved.balanced, moved.best_hit_tokens) == (
        other,
        0,
        True,
        32,
    )
    assert "worker='b'" in repr(moved)


def test_results_compare_and_hash_by_value() -> None:
    a = Result(200, ok=True, usage=TokenUsage(5, 4), ttfb_s=0.25)
    assert a == Result(200, True, TokenUsage(5, 4), 0.25) and hash(a) == hash(
        Result(200, True, TokenUsage(5, 4), 0.25)
    )
    assert a != Result(200, ok=True) and a != (200, True)
    assert (a.cached_tokens, a.prompt_tokens) == (4, 5)
    assert (Result(502, ok=False).cached_tokens, Result(502, ok=False).prompt_tokens) == (None, None)

"""session_affinity: rendezvous hashing, the bounded TTL table, and fallback when a worker goes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from policies import PolicyContext, RouteRequest, WorkerId, WorkerView
from policies.builtin.session_affinity import SessionAffinity, SessionAffinityParams, rendezvous_weight
from tests.unit.policies.fleets import worker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _policy(clock: Clock, **params: float) -> SessionAffinity:
    return SessionAffinity(SessionAffinityParams(**params), clock, random.Random(0))  # type: ignore[arg-type]


def _req(sid: str | None) -> RouteRequest:
    return RouteRequest(model="m", session_id=sid)


def _route(policy: SessionAffinity, sid: str | None, fleet: list[WorkerView]) -> str | None:
    decision = policy.select(_req(sid), fleet)
    policy.on_routed(_req(sid), decision)
    return decision.worker


FLEET = [worker(f"w{i}") for i in range(5)]


def test_same_session_goes_to_the_same_worker() -> None:
    policy = _policy(Clock())
    assert len({_route(policy, "alice", FLEET) for _ in range(10)}) == 1


def test_replicas_agree_without_shared_state() -> None:
    a, b = _policy(Clock()), _policy(Clock())
    sessions = [f"s{i}" for i in range(50)]
    assert [_route(a, s, FLEET) for s in sessions] == [_route(b, s, list(reversed(FLEET))) for s in sessions]
    assert len({_route(a, s, FLEET) for s in sessions}) == len(FLEET)


def test_rendezvous_weight_is_stable_across_processes() -> None:
    assert rendezvous_weight("alice", WorkerId("w1")) == rendezvous_weight("alice", WorkerId("w1"))
    assert rendezvous_weight("alice", WorkerId("w1")) != rendezvous_weight("alice", WorkerId("w2"))


def test_table_keeps_sessions_when_a_worker_joins() -> None:
    policy = _policy(Clock())
    sessions = [f"s{i}" for i in range(60)]
    before = {s: _route(policy, s, FLEET) for s in sessions}
    grown = [*FLEET, worker("w9")]
    assert {s: _route(policy, s, grown) for s in sessions} == before


@pytest.mark.parametrize(
    "change", [lambda w: None, lambda w: worker(w.id, healthy=False)], ids=["worker_gone", "worker_unhealthy"]
)
def test_falls_back_when_the_sessions_worker_is_unavailable(change: Any) -> None:
    policy = _policy(Clock())
    home = _route(policy, "alice", FLEET)
    changed = [x for x in (change(w) if w.id == home else w for w in FLEET) if x is not None]
    moved = _route(policy, "alice", changed)
    assert moved is not None and moved != home
    assert _route(policy, "alice", changed) == moved


def test_entries_expire_after_ttl() -> None:
    clock = Clock()
    policy = _policy(clock, ttl_s=10.0)
    _route(policy, "alice", FLEET)
    clock.now = 11.0
    _route(policy, "bob", FLEET)
    assert len(policy) == 1


def test_table_is_bounded() -> None:
    policy = _policy(Clock(), max_sessions=8)
    for i in range(100):
        _route(policy, f"s{i}", FLEET)
    assert len(policy) == 8


def test_requests_without_session_go_to_the_least_loaded() -> None:
    policy = _policy(Clock())
    fleet = [worker("a", inflight_tokens=50), worker("b", inflight_tokens=5)]
    assert _route(policy, None, fleet) == "b"
    assert len(policy) == 0


def test_built_from_config_with_params() -> None:
    from policies import build_policy

    policy = build_policy(
        {"type": "session_affinity", "params": {"ttl_s": 5, "max_sessions": 3}}, PolicyContext()
    )
    assert policy.select(_req("x"), FLEET).worker in {w.id for w in FLEET}

"""Role pools: the pure decision with a fake clock, and the balancer over a real registry."""

from __future__ import annotations

import pytest

from gateway.fleet.pools import Member, PoolBalancer, decide, initial_pool
from gateway.fleet.registry import Fleet
from gateway.settings import BreakerSettings, PoolSettings, WorkerSpec, parse_pool_settings
from gateway.state.memory import MemoryLoadBoard
from policies.api import Role

S = PoolSettings(ratio=2.0, min_pressure=1.0, dwell_s=10.0, prefill_slots=1.0, decode_slots=4.0)
P, D, B = Role.PREFILL, Role.DECODE, Role.BOTH


def _m(wid: str, pool: Role, load: int, capable: Role = B, since: float = 0.0, ok: bool = True) -> Member:
    return Member(wid, capable, pool, ok, load, since)


def test_saturated_prefill_takes_the_least_loaded_movable_decode_worker() -> None:
    members = [_m("p1", P, 5), _m("d1", D, 3), _m("d2", D, 1), _m("d3", D, 2, capable=D)]
    move = decide(members, 100.0, S)
    assert move is not None and (move.worker, move.to) == ("d2", P)
    assert move.reason == "prefill pressure 5.00 vs decode 0.50"


def test_saturated_decode_takes_a_prefill_worker() -> None:
    members = [_m("p1", P, 0), _m("p2", P, 1), _m("d1", D, 12)]
    move = decide(members, 100.0, S)
    assert move is not None and (move.worker, move.to) == ("p1", D)


def test_balanced_or_idle_fleets_stay() -> None:
    assert decide([_m("p1", P, 2), _m("d1", D, 8), _m("d2", D, 0)], 100.0, S) is None  # 2.0 vs 1.0: ratio 2
    assert decide([_m("p1", P, 0), _m("d1", D, 0), _m("d2", D, 0)], 100.0, S) is None  # idle
    assert decide([_m("p1", P, 3), _m("d1", D, 8), _m("d2", D, 8)], 100.0, S) is None  # 3.0 vs 2.0: busy


def test_dwell_time_blocks_a_recent_mover() -> None:
    members = [_m("p1", P, 5), _m("d1", D, 0, since=95.0), _m("d2", D, 0, since=95.0)]
    assert decide(members, 100.0, S) is None
    move = decide(members, 105.0, S)
    assert move is not None and move.worker == "d1"


def test_dedicated_workers_and_the_last_pool_member_never_move() -> None:
    assert decide([_m("p1", P, 9), _m("d1", D, 0, capable=D), _m("d2", D, 0, capable=D)], 100.0, S) is None
    assert decide([_m("p1", P, 9), _m("d1", D, 0)], 100.0, S) is None  # min_pool=1


def test_hysteresis_refuses_a_move_that_would_saturate_the_donor() -> None:
    # Prefill 4.0 vs decode 16/(2*4) = 2.0: saturated; after the move decode would be 16/4 = 4.0 vs 4/2 = 2.0.
    members = [_m("p1", P, 4), _m("d1", D, 8), _m("d2", D, 8)]
    assert decide(members, 100.0, S) is None


def test_unhealthy_workers_count_for_nothing() -> None:
    members = [_m("p1", P, 5), _m("d1", D, 0, ok=False), _m("d2", D, 0), _m("d3", D, 0)]
    move = decide(members, 100.0, S)
    assert move is not None and move.worker == "d2"


def test_new_both_workers_join_the_smaller_pool() -> None:
    assert initial_pool([]) is D
    assert initial_pool([D]) is P
    assert initial_pool([P, D, D]) is P


def test_parse_pool_settings() -> None:
    assert parse_pool_settings("off").enabled is False
    assert parse_pool_settings("auto") == PoolSettings()
    parsed = parse_pool_settings("ratio=3, dwell_s=0.5,min_pool=2")
    assert (parsed.ratio, parsed.dwell_s, parsed.min_pool) == (3.0, 0.5, 2)
    with pytest.raises(ValueError, match="unknown setting"):
        parse_pool_settings("speed=1")
    with pytest.raises(ValueError):
        parse_pool_settings("ratio=0.5")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_balancer_assigns_moves_and_explains() -> None:
    clock = Clock()
    fleet = Fleet(breaker=BreakerSettings(), clock=clock)
    for i, role in enumerate((B, B, B, D)):
        fleet.add(WorkerSpec(f"w{i}", f"http://w{i}", role)).healthy = True
    load = MemoryLoadBoard()
    balancer = PoolBalancer(fleet, load, S, clock)
    assert balancer.tick() is None
    roles = {r.id: r.role for r in fleet}
    assert roles == {"w0": D, "w1": P, "w2": D, "w3": D}
    assert balancer.describe("w1") == {
        "capable": "both", "pool": "prefill", "reason": "both-capable: joined the smaller pool (prefill)",
        "moves": 0,
    }  # fmt: skip
    for _ in range(6):
        load.acquire("w1", 100)  # a prefill queue builds up
    clock.now = 5.0
    assert balancer.tick() is None  # within the dwell time
    clock.now = 11.0
    move = balancer.tick()
    assert move is not None and (move.worker, move.to) == ("w0", P)
    assert fleet.get("w0") is not None and fleet.get("w0").role is P  # type: ignore[union-attr]
    state = balancer.describe("w0")
    assert state is not None and state["moves"] == 1 and state["reason"].startswith("prefill pressure 6.00")
    for _ in range(6):
        load.release("w1", 100)
    fleet.get("w3").queue_depth = 40  # type: ignore[union-attr]  # now decode saturates
    clock.now = 15.0
    move = balancer.tick()  # w0 (idle too, first by id) moved 4 s ago: its dwell holds it, w1 goes
    assert move is not None and (move.worker, move.to) == ("w1", D)
    clock.now = 30.0
    assert balancer.tick() is None  # only w0 is left in the prefill pool
    fleet.drain("w3")
    fleet.remove("w3")
    balancer.tick()
    assert balancer.describe("w3") is None

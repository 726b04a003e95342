"""Wiring: the policy learns from the load board how many gateway replicas share the fleet, and which it is."""

from __future__ import annotations

import time
from typing import cast

from gateway.deps import build_policy
from gateway.state.memory import MemoryLoadBoard
from gateway.state.protocols import LoadBoard
from policies.api import RouteRequest, WorkerId, WorkerView
from tests.unit.gateway.gateway_harness import settings_for


class SecondOfTwo:
    """What ``build_policy`` reads of a load board whose shared state holds two live replicas, this one ranked
    second (not a ``MemoryLoadBoard`` subclass: that class is compiled, ``kvgate_core.native``)."""

    def replicas(self) -> int:
        return 2

    def rank(self) -> int:
        return 1


def test_the_policy_reads_the_replica_count_and_rank_from_the_load_board() -> None:
    settings = settings_for(policy="prefix_cache_aware")
    idle = [WorkerView(id=WorkerId("w0")), WorkerView(id=WorkerId("w1"))]
    req = RouteRequest(model="m", num_prompt_tokens=64, block_hashes=(1, 2, 3, 4))
    replica = build_policy(settings, time.monotonic, cast("LoadBoard", SecondOfTwo()))
    assert {replica.select(req, idle).worker for _ in range(20)} == {"w1"}  # its home worker, every time
    lone = build_policy(settings, time.monotonic, MemoryLoadBoard())
    assert {lone.select(req, idle).worker for _ in range(50)} == {"w0", "w1"}  # equal costs: a draw

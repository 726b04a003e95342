"""Health rounds: model lists are read when a worker turns healthy and then rarely; probes are spread out."""

from __future__ import annotations

import asyncio
import itertools

import httpx

from gateway.fleet.health import HealthChecker
from gateway.fleet.registry import Fleet
from gateway.settings import BreakerSettings, WorkerSpec
from gateway.state.memory import MemoryLoadBoard


class FakeWorkers:
    """Every worker answers /health, /load and /v1/models; records what was asked, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []  # (host, path, loop time)
        self.down: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.calls.append((host, path, asyncio.get_running_loop().time()))
        if host in self.down:
            return httpx.Response(503)
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": f"model-{host}"}]})
        if path == "/load":
            return httpx.Response(200, json={"running": 1, "waiting": 2})
        return httpx.Response(200, json={"status": "ok"})

    def count(self, path: str) -> int:
        return sum(1 for _, p, _ in self.calls if p == path)


def _checker(workers: FakeWorkers, n: int, clock: list[float]) -> tuple[HealthChecker, Fleet]:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: clock[0])
    for i in range(n):
        fleet.add(WorkerSpec(id=f"w{i}", url=f"http://w{i}"))
    client = httpx.AsyncClient(transport=httpx.MockTransport(workers))
    checker = HealthChecker(
        fleet, client, MemoryLoadBoard(), interval_s=1.0, models_interval_s=30.0, clock=lambda: clock[0]
    )
    return checker, fleet


async def test_models_are_read_when_a_worker_turns_healthy_and_then_every_models_interval() -> None:
    workers, clock = FakeWorkers(), [0.0]
    checker, fleet = _checker(workers, 2, clock)
    await checker.round()
    assert workers.count("/v1/models") == 2 and workers.count("/load") == 2
    assert {r.id: sorted(r.models) for r in fleet} == {"w0": ["model-w0"], "w1": ["model-w1"]}
    for _ in range(5):  # later rounds within the interval: load only
        clock[0] += 1.0
        await checker.round()
    assert workers.count("/v1/models") == 2 and workers.count("/load") == 12
    workers.down.add("w1")
    clock[0] += 1.0
    await checker.round()
    workers.down.clear()
    clock[0] += 1.0
    await checker.round()  # w1 is back (maybe restarted with another model): read again at once
    assert [h for h, p, _ in workers.calls if p == "/v1/models"][2:] == ["w1"]
    clock[0] += 30.0
    await checker.round()
    assert workers.count("/v1/models") == 5


async def test_a_rounds_probes_are_spread_over_its_tick() -> None:
    workers, clock = FakeWorkers(), [0.0]
    checker, _ = _checker(workers, 4, clock)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await checker.round(spread_s=0.4)
    assert loop.time() - start >= 0.4  # the round lasts its tick
    firsts = sorted(t for _, p, t in workers.calls if p == "/health")
    assert len(firsts) == 4
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(firsts))  # 0.1 s apart, not a burst

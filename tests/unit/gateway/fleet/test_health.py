"""Health rounds: model lists are read when a worker turns healthy and then rarely; probes are spread out."""

from __future__ import annotations

import asyncio
import itertools

import orjson

from gateway.fleet.health import HealthChecker
from gateway.fleet.registry import Fleet
from gateway.settings import BreakerSettings, WorkerSpec
from gateway.state.memory import MemoryLoadBoard
from kvgate_core.h1 import H1Getter, H1Pool
from tests.support.procs import free_port
from tests.unit.gateway.fake_worker import FakeWorker, running


class FakeWorkers:
    """Every worker answers /health, /load and /v1/models; records what was asked, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []  # (host, path, loop time)
        self.down: set[str] = set()

    async def __call__(self, base_url: str, path: str) -> tuple[int, bytes]:
        host = base_url.removeprefix("http://")
        self.calls.append((host, path, asyncio.get_running_loop().time()))
        if host in self.down:
            return 503, b""
        if path == "/v1/models":
            return 200, orjson.dumps({"object": "list", "data": [{"id": f"model-{host}"}]})
        if path == "/load":
            return 200, orjson.dumps({"running": 1, "waiting": 2})
        return 200, b'{"status": "ok"}'

    def count(self, path: str) -> int:
        return sum(1 for _, p, _ in self.calls if p == path)


def _checker(workers: FakeWorkers, n: int, clock: list[float]) -> tuple[HealthChecker, Fleet]:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: clock[0])
    for i in range(n):
        fleet.add(WorkerSpec(id=f"w{i}", url=f"http://w{i}"))
    checker = HealthChecker(
        fleet, workers, MemoryLoadBoard(), interval_s=1.0, models_interval_s=30.0, clock=lambda: clock[0]
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


async def test_probes_over_the_h1_pool_against_a_real_worker() -> None:
    pool = H1Pool(connect_timeout_s=1.0)
    get = H1Getter(pool)
    sick = FakeWorker("sick", healthy=False)
    async with running(FakeWorker("w0"), sick) as (w0, _):
        fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
        for w in (w0, sick):
            fleet.add(WorkerSpec(id=w.name, url=w.url))
        fleet.add(WorkerSpec(id="gone", url=f"http://127.0.0.1:{free_port()}"))  # nothing listens there
        checker = HealthChecker(fleet, get, MemoryLoadBoard(), interval_s=1.0)
        for _ in range(3):  # keep-alive connections are reused round after round
            await checker.round()
        by = {r.id: r for r in fleet}
        assert by["w0"].healthy and by["w0"].models == {w0.model} and by["w0"].queue_depth == 2
        assert not by["sick"].healthy and not by["gone"].healthy
        assert await get(w0.url, "/load") == (
            200,
            b'{"running":1,"waiting":2,"kv_usage":0.25,"cached_blocks":7}',
        )
    pool.close()

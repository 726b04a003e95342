"""Fault and abuse tests on a real fleet (sim workers, gateways, redis-server), bounded in time.

They run the scenarios of ``loadtest.faults`` with small sizes and assert how every request ended.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.faults import (
    FaultConfig,
    bad_bodies,
    idle_connections,
    redis_restarted,
    slow_worker,
    worker_killed,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def cfg(tmp_path: Path) -> FaultConfig:
    return FaultConfig(duration_s=5.0, concurrency=8, log_dir=tmp_path)


async def test_worker_killed_loses_no_request_before_its_first_byte(cfg: FaultConfig) -> None:
    report = await worker_killed(cfg, stream=False)
    assert report.sent > 20
    assert report.failed == 0, report
    assert report.cut_streams == 0


async def test_worker_killed_mid_stream_ends_streams_with_an_error_event(cfg: FaultConfig) -> None:
    report = await worker_killed(cfg, stream=True)
    assert report.sent > 20
    assert report.failed == 0, report  # no HTTP-level failure: cut streams end with an error event
    assert report.ok >= report.sent - cfg.concurrency


async def test_redis_killed_and_restarted_under_load_fails_no_request(cfg: FaultConfig) -> None:
    report = await redis_restarted(cfg)
    assert report.sent > 20
    assert report.failed == 0, report
    assert report.cut_streams == 0, report


async def test_slow_worker_is_routed_around(cfg: FaultConfig) -> None:
    report = await slow_worker(cfg)
    assert report.failed == 0, report
    assert report.cut_streams == 0, report
    assert report.ok > 20
    assert report.slow_served is not None
    assert report.slow_served < report.ok * 0.1  # the slow worker serves (almost) nothing
    assert sum(1 for n in report.by_worker.values() if n > 0) >= 2


async def test_thousands_of_idle_connections_do_not_starve_requests(cfg: FaultConfig) -> None:
    report = await idle_connections(cfg, count=2000)
    assert report.failed == 0, report
    assert report.ok > 10


async def test_malformed_and_oversized_bodies_get_4xx_openai_errors(cfg: FaultConfig) -> None:
    report = await bad_bodies(cfg)
    assert report.failed == 0, report.notes

"""``/admin/workers`` shows each worker's engine: kind, how it was told, its load signal and cache facts."""

from __future__ import annotations

import httpx

from gateway.api.admin_routes import engine_info
from gateway.fleet.registry import Fleet
from gateway.settings import BreakerSettings, parse_worker
from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import serving, settings_for, until


async def test_admin_workers_shows_the_detected_engine() -> None:
    a = FakeWorker("a")
    async with running(a), serving(settings_for(a.url)) as base, httpx.AsyncClient() as client:

        async def detected() -> bool:
            rows = (await client.get(f"{base}/admin/workers")).json()["workers"]
            return bool(rows) and rows[0]["engine"]["load_signal"] == "engine"

        await until(detected)
        row = (await client.get(f"{base}/admin/workers")).json()["workers"][0]
    age = row["engine"].pop("load_age_s")
    assert isinstance(age, float) and 0 <= age < 30  # read by the last health round
    assert row["engine"] == {
        "kind": "kvgate",
        "configured": "auto",
        "detected_by": "/load (kvgate's worker shape)",
        "version": None,
        "served_model": "fake-model",
        "load_signal": "engine",
        "load_note": "from /load",
        "load_path": "/load",
        "block_size": 16,
        "block_size_source": "default",
        "kv_capacity_tokens": None,
        "prefix_reuse": True,
        "no_affinity_reason": None,
        "health": "/health",
        "parity_route": "/tokenize",
        "reports_cached_tokens": None,
        "index_mode": "none",  # this gateway's policy reads no prefix index
        "events": None,
        "units": None,
    }
    assert row["queue"] == 2 and row["cached_blocks"] == 7


def test_engine_info_of_a_configured_worker_before_detection() -> None:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    record = fleet.add(parse_worker("http://m:1#id=m&engine=mii"))
    info = engine_info(record).model_dump()
    assert info["kind"] == "mii" and info["configured"] == "mii" and info["detected_by"] == "configured"
    assert info["load_signal"] == "in-flight" and info["load_note"] == "not read yet"
    assert info["load_path"] is None and info["load_age_s"] is None
    assert info["no_affinity_reason"] == "no prefix cache in DeepSpeed-MII"
    assert info["prefix_reuse"] is False and info["parity_route"] is None
    assert (info["block_size"], info["block_size_source"]) == (128, "default")

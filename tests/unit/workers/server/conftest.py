"""A fast in-process simulated worker behind the worker app (httpx ASGITransport)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from kvgate_core.tokenize.bundle import byte_bundle
from workers.server.app import create_app
from workers.server.response_store import ResponseStore
from workers.sim.engine import SimConfig, SimEngine
from workers.sim.scheduler import SimTiming


@pytest.fixture
async def sim_client() -> AsyncIterator[httpx.AsyncClient]:
    """A client of a sim worker (fast timing, 4096 KV tokens, a response store of 4)."""
    timing = SimTiming(prefill_tps=1e7, decode_tps=1e5)
    engine = SimEngine(SimConfig(worker_id="w", timing=timing, kv_tokens=4096), byte_bundle("kvgate-sim"))
    await engine.start()
    app = create_app(engine, responses=ResponseStore(max_entries=4))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as client:
            yield client
    finally:
        await engine.stop()

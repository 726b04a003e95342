"""SimEngine: the async Engine surface over the scheduler (one loop, streams, aborts, shutdown)."""

from __future__ import annotations

import asyncio

import pytest

from kvgate_core.kvcontract.events import EventType
from kvgate_core.tokenize.bundle import byte_bundle
from workers.engine_api import ContextTooLongError, FinishReason, GenerationRequest, SamplingParams
from workers.sim.engine import SimConfig, SimEngine
from workers.sim.scheduler import SimTiming


def _engine(decode_tps: float = 1e5, max_running: int = 256) -> SimEngine:
    timing = SimTiming(prefill_tps=1e7, decode_tps=decode_tps, max_running=max_running, max_model_len=256)
    return SimEngine(SimConfig(worker_id="w", kv_tokens=8192, timing=timing), byte_bundle("kvgate-sim"))


def _req(i: int, max_tokens: int = 5) -> GenerationRequest:
    prompt = tuple(b"shared system prompt, long enough for two blocks " + str(i).encode())
    return GenerationRequest(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


async def test_many_concurrent_streams_finish_through_one_loop():
    engine = _engine(max_running=16)
    await engine.start()
    try:

        async def consume(i: int) -> int:
            return sum([len(c.token_ids) async for c in engine.generate(_req(i))])

        totals = await asyncio.wait_for(asyncio.gather(*(consume(i) for i in range(300))), 20)
    finally:
        await engine.stop()
    assert totals == [5] * 300
    assert engine.load().running == engine.load().waiting == 0


async def test_context_too_long_is_raised_by_generate_itself():
    engine = _engine()
    with pytest.raises(ContextTooLongError):
        engine.generate(_req(0, max_tokens=500))


async def test_stop_ends_in_flight_streams_with_abort():
    engine = _engine(decode_tps=2.0)
    await engine.start()
    stream = engine.generate(_req(0, max_tokens=100))
    first = await asyncio.wait_for(anext(stream), 10)
    assert first.finish_reason is None
    await engine.stop()
    rest = [c async for c in stream]
    assert rest[-1].finish_reason is FinishReason.ABORT
    assert engine.load().kv_usage == 0.0


async def test_events_reach_subscribers_and_aclose_frees_blocks():
    engine = _engine(decode_tps=2.0)
    await engine.start()
    events = engine.subscribe()
    try:
        stream = engine.generate(_req(0, max_tokens=100))
        await asyncio.wait_for(anext(stream), 10)
        stored = await asyncio.wait_for(anext(events), 10)
        assert stored.type is EventType.STORED
        assert len(stored.hashes) == 3  # 50 prompt tokens: three full blocks
        assert engine.load().running == 1
        await stream.aclose()
        assert engine.load().running == 0
        assert engine.load().kv_usage == 0.0
        assert sorted(engine.cached_block_hashes()["gpu"]) == sorted(stored.hashes)
    finally:
        await events.aclose()
        await engine.stop()

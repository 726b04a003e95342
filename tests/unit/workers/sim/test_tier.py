"""The sim's shared tier over a real Redis: push on prefill, pull on a miss, events, outages."""

from __future__ import annotations

import asyncio

import pytest

from kvgate_core.kvcontract.events import EventType, Tier
from kvgate_core.tokenize.bundle import byte_bundle
from workers.engine_api import GenerationChunk, GenerationRequest, SamplingParams
from workers.sim.engine import SimConfig, SimEngine
from workers.sim.scheduler import SimTiming
from workers.sim.tier import PullCost, SimTier

PROMPT = tuple(b"a shared system prompt that spans several sixteen-token blocks of the sim. " * 2)  # 150


def _engine(worker: str, url: str, *, bytes_per_s: float = 1e10, prefill_tps: float = 1e4) -> SimEngine:
    timing = SimTiming(prefill_tps=prefill_tps, decode_tps=1e4, max_model_len=1024)
    tier = SimTier.from_url(url, "kvgate-sim", PullCost(bytes_per_s, 0.0001, 16 * 23040))
    return SimEngine(
        SimConfig(worker_id=worker, kv_tokens=8192, timing=timing), byte_bundle("kvgate-sim"), tier=tier
    )


async def _last(engine: SimEngine, max_tokens: int) -> GenerationChunk:
    req = GenerationRequest("r", PROMPT, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    chunks = [c async for c in engine.generate(req)]
    return chunks[-1]


async def test_decode_worker_pulls_what_the_prefill_worker_pushed(redis_url: str) -> None:
    prefill, decode = _engine("p", redis_url), _engine("d", redis_url)
    await prefill.start()
    await decode.start()
    events = prefill.subscribe()
    try:
        first = await asyncio.wait_for(_last(prefill, 1), 10)
        assert first.num_cached_tokens == 0
        # Answered only after the push: the other process-level reader sees the blocks at once.
        pushed = [e for e in events.drain() if e.tier is Tier.DRAM]
        assert [e.type for e in pushed] == [EventType.STORED]
        assert len(pushed[0].hashes) == len(PROMPT) // 16
        last = await asyncio.wait_for(_last(decode, 4), 10)
        assert last.num_prompt_tokens == len(PROMPT)
        assert last.num_cached_tokens == (len(PROMPT) - 1) // 16 * 16  # the last token is always computed
        assert last.num_output_tokens == 4
    finally:
        await events.aclose()
        await prefill.stop()
        await decode.stop()


async def test_a_pull_slower_than_recomputing_is_not_taken(redis_url: str) -> None:
    prefill = _engine("p", redis_url)
    slow = _engine("d", redis_url, bytes_per_s=1e3, prefill_tps=1e7)
    await prefill.start()
    await slow.start()
    try:
        await asyncio.wait_for(_last(prefill, 1), 10)
        last = await asyncio.wait_for(_last(slow, 2), 10)
        assert last.num_cached_tokens == 0
    finally:
        await prefill.stop()
        await slow.stop()


async def test_an_unreachable_tier_is_a_miss_not_a_failure(port: int) -> None:
    engine = _engine("w", f"redis://127.0.0.1:{port}/0")
    await engine.start()
    try:
        last = await asyncio.wait_for(_last(engine, 3), 10)
        assert last.num_output_tokens == 3 and last.num_cached_tokens == 0
    finally:
        await engine.stop()


def test_pull_cost_rejects_bad_values() -> None:
    with pytest.raises(ValueError):
        PullCost(0.0, 0.001, 100)
    assert PullCost(1e9, 0.001, 1000).seconds(0) == 0.0
    assert PullCost(1e9, 0.001, 1000).seconds(1000) == pytest.approx(0.002)

"""Pulled KV equals computed KV: real tiny engines sharing a real Redis DRAM tier and an SSD directory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import redis

from workers.engine.engine import TorchEngine
from workers.engine.serve import EngineOptions, build_engine_from_options
from workers.engine_api import GenerationChunk, GenerationRequest, SamplingParams

PROMPT = tuple((i * 37 + 11) % 250 + 3 for i in range(100))  # 100 tokens: 6 full blocks before the last token
PULLABLE = (len(PROMPT) - 1) // 16 * 16


@asynccontextmanager
async def _engine(
    name: str, kv_tier: str | None = None, ssd_dir: str | None = None
) -> AsyncIterator[TorchEngine]:
    options = EngineOptions(model="tiny", kv_tokens=2048, worker_id=name, kv_tier=kv_tier, ssd_dir=ssd_dir)
    engine = build_engine_from_options(options)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def _run(engine: TorchEngine, rid: str, max_tokens: int) -> tuple[list[int], GenerationChunk]:
    request = GenerationRequest(
        rid,
        PROMPT,
        SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        model="kvgate-tiny",
    )
    chunks = [c async for c in engine.generate(request)]
    return [t for c in chunks for t in c.token_ids], chunks[-1]


def _pulled(engine: TorchEngine) -> int:
    connector = engine.connector
    assert connector is not None
    return connector.pulled_blocks


async def _greedy_from_scratch() -> list[int]:
    async with _engine("ref") as ref:
        tokens, last = await asyncio.wait_for(_run(ref, "ref", 8), 60)
    assert last.num_cached_tokens == 0
    return tokens


async def _prefill_then_decode(
    prefill_tier: dict[str, str], decode_tier: dict[str, str]
) -> tuple[list[int], int, int]:
    async with _engine("prefill", **prefill_tier) as prefill:
        _, first = await asyncio.wait_for(_run(prefill, "p", 1), 60)  # answers once the blocks are durable
        assert first.num_cached_tokens == 0
    async with _engine("decode", **decode_tier) as decode:
        tokens, last = await asyncio.wait_for(_run(decode, "d", 8), 60)
        return tokens, last.num_cached_tokens, _pulled(decode)


async def test_decode_from_pulled_redis_blocks_equals_local_prefill(redis_url: str, tmp_path: Path) -> None:
    expected = await _greedy_from_scratch()
    tier = {"kv_tier": redis_url, "ssd_dir": str(tmp_path / "ssd")}
    tokens, cached, pulled = await _prefill_then_decode(tier, {"kv_tier": redis_url})
    assert tokens == expected
    assert cached == PULLABLE and pulled == PULLABLE // 16


async def test_decode_from_pulled_ssd_blocks_equals_local_prefill(redis_url: str, tmp_path: Path) -> None:
    expected = await _greedy_from_scratch()
    tier = {"kv_tier": redis_url, "ssd_dir": str(tmp_path / "ssd")}
    async with _engine("prefill", **tier) as prefill:
        await asyncio.wait_for(_run(prefill, "p", 1), 60)
    redis.Redis.from_url(redis_url).flushall()  # DRAM lost: only the SSD copy is left
    async with _engine("decode", ssd_dir=str(tmp_path / "ssd")) as decode:
        tokens, last = await asyncio.wait_for(_run(decode, "d", 8), 60)
        assert tokens == expected
        assert last.num_cached_tokens == PULLABLE and _pulled(decode) == PULLABLE // 16


async def test_a_corrupted_tier_block_is_recomputed_not_served(redis_url: str) -> None:
    expected = await _greedy_from_scratch()
    async with _engine("prefill", kv_tier=redis_url) as prefill:
        await asyncio.wait_for(_run(prefill, "p", 1), 60)
    client = redis.Redis.from_url(redis_url)
    keys = sorted(client.keys("kvgate:kv:*"))
    assert len(keys) >= PULLABLE // 16
    for key in keys:  # flip one payload byte in every block: all fail their checksum
        raw = client.get(key)
        assert isinstance(raw, bytes)
        value = bytearray(raw)
        value[-1] ^= 0xFF
        client.set(key, bytes(value))
    async with _engine("decode", kv_tier=redis_url) as decode:
        tokens, last = await asyncio.wait_for(_run(decode, "d", 8), 60)
        assert tokens == expected
        assert last.num_cached_tokens == 0 and _pulled(decode) == 0

"""The fakes' shared core: the prefix cache, the scheduler's running/waiting figures, delays and faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tokenize.request_prompt import ChatPrompt
from tests.support.engines.cache import Block, PrefixCache, namespace_root
from tests.support.engines.core import EngineConfig, EngineFailureError, FakeEngine, GenRequest
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)


def test_match_counts_whole_cached_blocks_only() -> None:
    cache = PrefixCache(4, 100)
    ids = list(range(10))
    assert cache.match(ids) == 0
    stored, evicted = cache.insert(ids)
    assert [b.tokens for b in stored] == [(0, 1, 2, 3), (4, 5, 6, 7)] and not evicted
    assert stored[1].parent == stored[0].hash and stored[0].parent is None
    assert cache.match(ids) == 8
    assert cache.match([0, 1, 2, 3, 9, 9, 9, 9]) == 4
    assert cache.match(ids, namespace_root("salt", None)) == 0  # another namespace shares nothing


def test_partial_blocks_are_stored_but_never_matched() -> None:
    cache = PrefixCache(4, 100, partial_blocks=True)
    stored, _ = cache.insert(list(range(6)))
    assert [len(b.tokens) for b in stored] == [4, 2]
    assert cache.match(list(range(6))) == 4


def test_eviction_is_lru_and_leaf_first() -> None:
    cache = PrefixCache(2, 3)
    cache.insert([1, 1, 2, 2, 3, 3])
    cache.insert([9, 9])  # the cache is full: the leaf of the older chain goes first
    assert cache.match([1, 1, 2, 2, 3, 3]) == 4
    _, evicted = cache.insert([8, 8, 7, 7])
    assert len(cache) == 3
    assert [b.tokens for b in evicted] == [
        (9, 9),
        (2, 2),
    ]  # least recent first, a chain's leaf before its root


def test_disabled_cache_stores_nothing() -> None:
    cache = PrefixCache(2, 3, enabled=False)
    assert cache.insert([1, 2, 3, 4]) == ([], [])
    assert cache.match([1, 2, 3, 4]) == 0


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []

    def on_cache_events(self, stored: Sequence[Block], removed: Sequence[Block], cleared: bool) -> None:
        self.calls.append((len(stored), len(removed), cleared))


def _engine(**kw: object) -> tuple[FakeEngine, Recorder]:
    rec = Recorder()
    config = EngineConfig(model="m", block_size=16, **kw)  # type: ignore[arg-type]
    return FakeEngine(config, [rec]), rec


async def test_generation_reports_cached_tokens_and_stores_blocks() -> None:
    engine, rec = _engine(decode_ms_per_token=0.1)
    ids = byte_bundle().encode(ChatPrompt([{"role": "user", "content": "x" * 60}]))
    first = engine.submit(GenRequest(ids, 3))
    text, finish = await first.collect()
    assert len(text) == 3 and finish == "length"
    again = engine.submit(GenRequest(ids, 3))
    assert await again.collect() == (text, finish)  # deterministic
    assert first.cached_tokens == 0 and again.cached_tokens == len(ids) // 16 * 16
    assert rec.calls == [(len(ids) // 16, 0, False)]
    engine.reset()
    assert rec.calls[-1] == (0, len(ids) // 16, True)


async def test_waiting_queue_is_real_and_fifo() -> None:
    engine, _ = _engine(max_running=1, decode_ms_per_token=20)
    gens = [engine.submit(GenRequest([1, 2, 3], 5, seed=i)) for i in range(3)]
    await eventually(lambda: engine.stats().running == 1 and engine.stats().waiting == 2)
    assert engine.stats().waiting_tokens == 6
    await asyncio.gather(*(g.collect() for g in gens))
    assert (engine.stats().running, engine.stats().waiting, engine.stats().finished_total) == (0, 0, 3)


async def test_cancelled_waiter_leaves_the_queue() -> None:
    engine, _ = _engine(max_running=1, decode_ms_per_token=20)
    running = engine.submit(GenRequest([1], 3))
    waiter = engine.submit(GenRequest([2], 3))
    await eventually(lambda: engine.stats().waiting == 1)
    waiter.cancel()
    await eventually(lambda: engine.stats().waiting == 0)
    await running.collect()
    assert engine.stats().running == 0


async def test_slow_factor_multiplies_prefill_and_decode() -> None:
    async def ttft(factor: float) -> float:
        engine, _ = _engine(prefill_ms_per_token=1.0, slow_factor=factor)
        t0 = time.perf_counter()
        await engine.submit(GenRequest(list(range(40)), 1)).next()
        return time.perf_counter() - t0

    fast, slow = await ttft(1.0), await ttft(4.0)
    assert slow > 0.12 and slow > 2.5 * fast


async def test_faults_fail_after_n_tokens_and_broken_fails_all() -> None:
    engine, _ = _engine(decode_ms_per_token=0.1)
    engine.faults.fail_after_tokens, engine.faults.count = 2, 1
    gen = engine.submit(GenRequest([1, 2], 8))
    assert (await gen.next()) is not None and (await gen.next()) is not None
    with pytest.raises(EngineFailureError):
        await gen.next()
    assert (await engine.submit(GenRequest([1, 2], 2)).collect())[1] == "length"  # the count is spent
    engine.faults.broken = True
    with pytest.raises(EngineFailureError):
        await engine.submit(GenRequest([1, 2], 2)).collect()

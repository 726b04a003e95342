"""One conformance suite for every KV tier: Redis (dram), SSD, and layered (dram over ssd).

Each backend adds only a factory (``_build``) returning a ``Harness``: the tier, a second client on the
same store, a way to write raw values behind the tier's back, and a way to take its store down and back.
Redis is a real ``redis-server``: the shared session server for ordinary tests, a private one for the
tests that change its memory limit or kill it.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from kvgate_core.kvcontract.events import EventType, KVEvent, Tier
from kvgate_core.kvcontract.wire import BlockLayout, BlockMeta, pack_block
from tests.support.redis_cluster import RedisCluster, new_redis_cluster
from tests.support.redis_server import RedisServer, new_redis_server
from workers.kvtier.events import TierEvents
from workers.kvtier.layered import LayeredConfig, LayeredTier
from workers.kvtier.protocols import WritableTier
from workers.kvtier.redis_tier import RedisTier, RedisTierConfig, block_key
from workers.kvtier.ssd_tier import SsdTier, SsdTierConfig, block_path, model_dir

MODEL = "org/tiny-model"
LAYOUT = BlockLayout(num_layers=2, block_size=16, dtype="float32", shape=(2, 2, 16, 2, 32))
BIG = 1 << 30
KINDS = ["redis", "ssd", "layered"]
ALL_KINDS = [*KINDS, "redis-cluster"]  # the cluster is not killed or resized: it skips those two tests


def value(block_hash: int, *, seed: int = 0, model: str = MODEL, meta_hash: int | None = None) -> bytes:
    payload = bytes((block_hash * 31 + seed + i) & 0xFF for i in range(256)) * (LAYOUT.payload_bytes // 256)
    meta = BlockMeta.of(model, block_hash if meta_hash is None else meta_hash, LAYOUT)
    return pack_block(meta, payload)


@dataclass
class Harness:
    tier: WritableTier
    open_twin: Callable[[], Awaitable[WritableTier]]
    raw_put: Callable[[int, bytes], Awaitable[None]]
    outage: Callable[[], Awaitable[None]]
    recover: Callable[[], Awaitable[None]]
    serves_during_outage: bool
    events: list[KVEvent] = field(default_factory=list)

    async def settle(self, tier: WritableTier | None = None) -> None:
        """Wait for write-behind queues (layered) to drain."""
        t = tier or self.tier
        if isinstance(t, LayeredTier):
            await t.flush()


@dataclass
class Env:
    stack: AsyncExitStack
    tmp_path: Path
    redis_url: str
    redis_server: RedisServer | None  # a private server the test may reconfigure or kill
    events: list[KVEvent]
    cluster: bool = False


async def _redis_tier(env: Env, capacity_bytes: int) -> RedisTier:
    cfg = RedisTierConfig(env.redis_url, MODEL, layout=LAYOUT, timeout_s=2.0, cluster=env.cluster)
    tier = RedisTier(cfg, events=TierEvents(env.events.append, "w1", Tier.DRAM))
    env.stack.push_async_callback(tier.aclose)
    if capacity_bytes < BIG:
        if env.redis_server is None:
            raise RuntimeError("a capacity test needs a private redis-server")
        raw = aioredis.Redis.from_url(env.redis_url)
        used = int((await raw.info("memory"))["used_memory"])
        await raw.config_set("maxmemory", used + capacity_bytes)
        await raw.config_set("maxmemory-policy", "allkeys-lru")
        await raw.aclose()
    return tier


async def _ssd_tier(env: Env, capacity_bytes: int) -> SsdTier:
    cfg = SsdTierConfig(env.tmp_path / "ssd", MODEL, capacity_bytes, layout=LAYOUT, io_threads=4)
    tier = await SsdTier.open(cfg, events=TierEvents(env.events.append, "w1", Tier.SSD))
    env.stack.push_async_callback(tier.aclose)
    return tier


async def _redis_raw(env: Env, block_hash: int, raw: bytes) -> None:
    client = (aioredis.RedisCluster if env.cluster else aioredis.Redis).from_url(env.redis_url)
    await client.set(block_key("kvgate:kv", MODEL, block_hash), raw)
    await client.aclose()


def _ssd_raw(env: Env, block_hash: int, raw: bytes) -> None:
    path = block_path(env.tmp_path / "ssd", MODEL, block_hash)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)


async def _ssd_outage(env: Env) -> None:
    # The disk "goes away": the model directory becomes a plain file, so every open/mkdir fails.
    root = model_dir(env.tmp_path / "ssd", MODEL)
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_bytes(b"")


async def _ssd_recover(env: Env) -> None:
    model_dir(env.tmp_path / "ssd", MODEL).unlink()


async def _redis_outage(env: Env) -> None:
    assert env.redis_server is not None, "outage tests use a private redis-server"
    env.redis_server.stop()


async def _redis_recover(env: Env) -> None:
    assert env.redis_server is not None
    env.redis_server.start()


async def _build(kind: str, env: Env, capacity_bytes: int = BIG) -> Harness:
    if kind in ("redis", "redis-cluster"):
        return Harness(
            tier=await _redis_tier(env, capacity_bytes),
            open_twin=lambda: _redis_tier(env, BIG),
            raw_put=lambda h, raw: _redis_raw(env, h, raw),
            outage=lambda: _redis_outage(env),
            recover=lambda: _redis_recover(env),
            serves_during_outage=False,
            events=env.events,
        )
    if kind == "ssd":
        return Harness(
            tier=await _ssd_tier(env, capacity_bytes),
            open_twin=lambda: _ssd_tier(env, BIG),
            raw_put=lambda h, raw: asyncio.to_thread(_ssd_raw, env, h, raw),
            outage=lambda: _ssd_outage(env),
            recover=lambda: _ssd_recover(env),
            serves_during_outage=False,
            events=env.events,
        )

    async def layered() -> LayeredTier:
        tier = LayeredTier(
            await _redis_tier(env, capacity_bytes),
            await _ssd_tier(env, capacity_bytes),
            LayeredConfig(queue_blocks=256),
        )
        env.stack.push_async_callback(tier.aclose)
        return tier

    async def raw_both(h: int, raw: bytes) -> None:
        await _redis_raw(env, h, raw)
        await asyncio.to_thread(_ssd_raw, env, h, raw)

    return Harness(
        tier=await layered(),
        open_twin=layered,
        raw_put=raw_both,
        outage=lambda: _redis_outage(env),  # DRAM down: reads fall through to SSD
        recover=lambda: _redis_recover(env),
        serves_during_outage=True,
        events=env.events,
    )


@pytest.fixture(params=ALL_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=KINDS)
def private_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = new_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def env(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    if kind == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        cluster.flushall()
        url, is_cluster = cluster.url, True
    else:
        url, is_cluster = request.getfixturevalue("redis_url"), False
    async with AsyncExitStack() as stack:
        yield Env(stack, tmp_path, url, None, [], cluster=is_cluster)


@pytest.fixture
async def private_env(tmp_path: Path) -> AsyncIterator[Env]:
    server = new_redis_server(tmp_path / "redis")
    try:
        async with AsyncExitStack() as stack:
            yield Env(stack, tmp_path, server.url, server, [])
    finally:
        server.stop()


async def test_round_trip(kind: str, env: Env) -> None:
    h = await _build(kind, env)
    blocks = [(n, value(n)) for n in range(1, 9)]
    assert await h.tier.put_many(blocks) == len(blocks)
    await h.settle()
    assert await h.tier.get_many([n for n, _ in blocks]) == [v for _, v in blocks]
    stats = h.tier.stats()
    assert (stats.hits, stats.corrupt, stats.mismatched, stats.errors) == (8, 0, 0, 0)
    assert not h.tier.is_degraded
    stored = {x for e in h.events if e.type is EventType.STORED for x in e.hashes}
    assert stored >= {n for n, _ in blocks}


async def test_miss_and_leading_prefix(kind: str, env: Env) -> None:
    h = await _build(kind, env)
    await h.tier.put_many([(1, value(1)), (2, value(2)), (4, value(4))])
    await h.settle()
    assert await h.tier.get_many([3, 1]) == [None, value(1)]
    assert await h.tier.exists_many([1, 2, 3, 4]) == [True, True, False, True]
    assert await h.tier.contains_prefix([1, 2, 3, 4]) == 2
    assert await h.tier.contains_prefix([3, 1]) == 0
    assert await h.tier.get_many([]) == []
    assert h.tier.stats().misses == 1


async def test_delete_removes_blocks(kind: str, env: Env) -> None:
    h = await _build(kind, env)
    await h.tier.put_many([(1, value(1)), (2, value(2))])
    await h.settle()
    assert await h.tier.delete_many([1, 99]) == 1
    assert await h.tier.get_many([1, 2]) == [None, value(2)]


async def test_capacity_evicts_old_blocks(private_kind: str, private_env: Env) -> None:
    block = len(value(0))
    h = await _build(private_kind, private_env, capacity_bytes=8 * block)
    hashes = list(range(1, 41))
    for i in range(0, len(hashes), 4):
        await h.tier.put_many([(n, value(n)) for n in hashes[i : i + 4]])
        await h.settle()
    got = await h.tier.get_many(hashes)
    present = [n for n, v in zip(hashes, got, strict=True) if v is not None]
    assert all(v == value(n) for n, v in zip(hashes, got, strict=True) if v is not None)
    # Redis's LRU is approximate (and its clock has 1 s resolution): bound the count, not the order.
    assert 1 <= len(present) <= 20
    assert h.tier.stats().errors == 0


@pytest.mark.parametrize(
    "damage",
    [lambda v: v[:-100], lambda v: v[:20], lambda v: v[:-1] + bytes([v[-1] ^ 1]), lambda v: b"junk" + v[4:]],
    ids=["truncated", "header-only", "bit-flip", "bad-magic"],
)
async def test_damaged_values_are_counted_misses(
    kind: str, env: Env, damage: Callable[[bytes], bytes]
) -> None:
    h = await _build(kind, env)
    await h.raw_put(7, damage(value(7)))
    assert await h.tier.get_many([7]) == [None]
    assert h.tier.stats().corrupt >= 1
    await h.tier.put_many([(7, value(7))])
    await h.settle()
    assert await h.tier.get_many([7]) == [value(7)]


async def test_foreign_values_are_counted_misses(kind: str, env: Env) -> None:
    h = await _build(kind, env)
    await h.raw_put(5, value(5, meta_hash=6))
    await h.raw_put(6, value(6, model="another-model"))
    assert await h.tier.get_many([5, 6]) == [None, None]
    assert h.tier.stats().mismatched >= 2


async def test_concurrent_writers_of_one_block(kind: str, env: Env) -> None:
    h = await _build(kind, env)
    twin = await h.open_twin()
    versions = [value(9, seed=s) for s in range(4)]  # same block, different (valid) bytes
    await asyncio.gather(*(t.put_many([(9, v)]) for _ in range(3) for t in (h.tier, twin) for v in versions))
    await h.settle()
    await h.settle(twin)
    for t in (h.tier, twin):
        (got,) = await t.get_many([9])
        assert got in versions  # one whole write won; never a mix of two
    assert not list(env.tmp_path.rglob("*.tmp"))  # every temp file was renamed into place


async def test_store_outage_degrades_then_recovers(private_kind: str, private_env: Env) -> None:
    h = await _build(private_kind, private_env)
    blocks = [(n, value(n)) for n in (1, 2, 3)]
    await h.tier.put_many(blocks)
    await h.settle()
    await h.outage()
    got = await h.tier.get_many([1, 2, 3])
    expected = [v for _, v in blocks] if h.serves_during_outage else [None] * 3
    assert got == expected
    assert await h.tier.put_many([(4, value(4))]) in (0, 1)  # never raises; layered only queues it
    await h.settle()
    await h.tier.exists_many([1, 2])
    assert h.tier.is_degraded
    assert h.tier.stats().errors >= 1
    await h.recover()
    await h.tier.put_many([(5, value(5))])
    await h.settle()
    assert await h.tier.get_many([5]) == [value(5)]
    assert not h.tier.is_degraded

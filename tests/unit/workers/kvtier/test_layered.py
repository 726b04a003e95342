"""Layered tier specifics: promotion, write-behind queue limits, demotion; with in-memory fake tiers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from workers.kvtier.layered import LayeredConfig, LayeredTier
from workers.kvtier.protocols import leading_present
from workers.kvtier.stats import TierStats


class FakeTier:
    """A dict-backed WritableTier; ``gate`` (when set) holds writes until it is opened."""

    def __init__(self) -> None:
        self.data: dict[int, bytes] = {}
        self.gate: asyncio.Event | None = None
        self.closed = False
        self.put_calls = 0

    @property
    def is_degraded(self) -> bool:
        return False

    def stats(self) -> TierStats:
        return TierStats()

    async def get_many(self, hashes: Sequence[int]) -> list[bytes | None]:
        return [self.data.get(h) for h in hashes]

    async def exists_many(self, hashes: Sequence[int]) -> list[bool]:
        return [h in self.data for h in hashes]

    async def contains_prefix(self, hashes: Sequence[int]) -> int:
        return leading_present(await self.exists_many(hashes))

    async def put_many(self, blocks: Sequence[tuple[int, bytes]]) -> int:
        self.put_calls += 1
        if self.gate is not None:
            await self.gate.wait()
        self.data.update(blocks)
        return len(blocks)

    async def delete_many(self, hashes: Sequence[int]) -> int:
        return sum(self.data.pop(h, None) is not None for h in hashes)

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def tiers() -> tuple[FakeTier, FakeTier]:
    return FakeTier(), FakeTier()


async def test_reads_dram_first_then_ssd_and_promotes(tiers: tuple[FakeTier, FakeTier]) -> None:
    dram, ssd = tiers
    dram.data[1] = b"d1"
    ssd.data.update({1: b"s1", 2: b"s2"})
    tier = LayeredTier(dram, ssd)
    assert await tier.get_many([1, 2, 3]) == [b"d1", b"s2", None]
    await tier.flush()
    assert dram.data == {1: b"d1", 2: b"s2"}
    assert (tier.stats().promoted, tier.stats().hits, tier.stats().misses) == (1, 2, 1)
    assert await tier.contains_prefix([1, 2, 3]) == 2
    await tier.aclose()
    assert dram.closed and ssd.closed


async def test_writes_go_behind_to_both_tiers(tiers: tuple[FakeTier, FakeTier]) -> None:
    dram, ssd = tiers
    tier = LayeredTier(dram, ssd)
    assert await tier.put_many([(1, b"a"), (2, b"b")]) == 2
    await tier.flush()
    assert dram.data == ssd.data == {1: b"a", 2: b"b"}
    await tier.aclose()


async def test_full_queue_drops_trailing_blocks_without_blocking(tiers: tuple[FakeTier, FakeTier]) -> None:
    dram, ssd = tiers
    dram.gate = asyncio.Event()  # the writer is stuck on DRAM
    tier = LayeredTier(dram, ssd, LayeredConfig(queue_blocks=3))
    assert await tier.put_many([(1, b"a"), (2, b"b")]) == 2
    assert await tier.put_many([(3, b"c"), (4, b"d"), (5, b"e")]) == 1  # returns at once
    assert (tier.pending_blocks, tier.stats().dropped) == (3, 2)
    dram.gate.set()
    await tier.flush()
    assert sorted(ssd.data) == [1, 2, 3]
    assert tier.pending_blocks == 0
    await tier.aclose()


async def test_demote_moves_blocks_from_dram_to_ssd(tiers: tuple[FakeTier, FakeTier]) -> None:
    dram, ssd = tiers
    dram.data.update({1: b"a", 2: b"b"})
    tier = LayeredTier(dram, ssd, LayeredConfig(write_ssd=False))
    assert await tier.demote_many([1, 9]) == 1
    assert (dram.data, ssd.data) == ({2: b"b"}, {1: b"a"})
    assert await tier.get_many([1]) == [b"a"]
    assert tier.stats().demoted == 1
    await tier.aclose()


async def test_write_ssd_off_keeps_new_blocks_in_dram_only(tiers: tuple[FakeTier, FakeTier]) -> None:
    dram, ssd = tiers
    tier = LayeredTier(dram, ssd, LayeredConfig(write_ssd=False, promote=False))
    await tier.put_many([(1, b"a")])
    await tier.flush()
    assert (dram.data, ssd.data) == ({1: b"a"}, {})
    await tier.aclose()


async def test_a_failing_write_does_not_stop_the_writer(tiers: tuple[FakeTier, FakeTier]) -> None:
    dram, ssd = tiers

    async def broken(blocks: Sequence[tuple[int, bytes]]) -> int:
        raise RuntimeError("bug in a tier")

    dram.put_many = broken  # type: ignore[method-assign]
    tier = LayeredTier(dram, ssd)
    await tier.put_many([(1, b"a")])
    await tier.flush()
    await tier.put_many([(2, b"b")])
    await tier.flush()
    assert ssd.data == {}  # SSD write of a batch comes after DRAM's; the failed batch stops there
    assert tier.pending_blocks == 0
    await tier.aclose()

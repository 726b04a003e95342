"""SSD tier specifics beyond the conformance suite: exact LRU, rebuild on restart, temp-file cleanup."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kvgate_core.kvcontract.events import EventType, KVEvent, Tier
from kvgate_core.kvcontract.wire import BlockLayout, BlockMeta, pack_block
from workers.kvtier.events import TierEvents
from workers.kvtier.ssd_scan import STALE_TMP_S, scan_blocks
from workers.kvtier.ssd_tier import SsdTier, SsdTierConfig, block_path, model_dir

LAYOUT = BlockLayout(num_layers=1, block_size=4, dtype="uint8", shape=(1000,))
MODEL = "HuggingFaceTB/SmolLM2-135M"


def value(h: int) -> bytes:
    return pack_block(BlockMeta.of(MODEL, h, LAYOUT), bytes([h % 256]) * 1000)


SIZE = len(value(0))


def config(root: Path, blocks: int) -> SsdTierConfig:
    return SsdTierConfig(root, MODEL, capacity_bytes=blocks * SIZE, layout=LAYOUT, io_threads=2)


def test_paths_follow_the_contract(tmp_path: Path) -> None:
    path = block_path(tmp_path, MODEL, 0xAB12)
    assert path == tmp_path / "HuggingFaceTB%2FSmolLM2-135M" / "00" / "000000000000ab12.kv"


async def test_evicts_least_recently_used_and_publishes_removals(tmp_path: Path) -> None:
    events: list[KVEvent] = []
    tier = await SsdTier.open(config(tmp_path, 3), events=TierEvents(events.append, "w", Tier.SSD))
    await tier.put_many([(1, value(1)), (2, value(2)), (3, value(3))])
    await tier.get_many([1])  # 2 is now the least recently used
    await tier.put_many([(4, value(4))])
    assert await tier.exists_many([1, 2, 3, 4]) == [True, False, True, True]
    assert not block_path(tmp_path, MODEL, 2).exists()
    assert tier.used_bytes == 3 * SIZE
    assert tier.stats().evicted == 1
    assert KVEvent("w", EventType.REMOVED, Tier.SSD, (2,), events[-1].ts) in events
    await tier.aclose()


async def test_restart_rebuilds_index_in_access_order(tmp_path: Path) -> None:
    tier = await SsdTier.open(config(tmp_path, 10))
    await tier.put_many([(h, value(h)) for h in (1, 2, 3)])
    await tier.aclose()
    now = time.time()
    for age, h in ((300, 2), (200, 3), (100, 1)):  # 2 is the oldest
        os.utime(block_path(tmp_path, MODEL, h), (now - age, now - age))
    reopened = await SsdTier.open(config(tmp_path, 3))
    assert reopened.used_bytes == 3 * SIZE
    assert await reopened.get_many([3]) == [value(3)]
    await reopened.put_many([(4, value(4))])
    assert await reopened.exists_many([1, 2, 3, 4]) == [True, False, True, True]
    await reopened.aclose()


async def test_open_shrinks_to_a_smaller_capacity(tmp_path: Path) -> None:
    tier = await SsdTier.open(config(tmp_path, 10))
    await tier.put_many([(h, value(h)) for h in range(1, 7)])
    await tier.aclose()
    small = await SsdTier.open(config(tmp_path, 2))
    assert small.used_bytes == 2 * SIZE
    assert len(list(model_dir(tmp_path, MODEL).rglob("*.kv"))) == 2
    await small.aclose()


def test_scan_removes_only_stale_temp_files(tmp_path: Path) -> None:
    sub = model_dir(tmp_path, MODEL) / "00"
    sub.mkdir(parents=True)
    (sub / "0000000000000001.kv").write_bytes(b"x" * 5)
    (sub / "notahash.kv").write_bytes(b"x")
    stale, fresh = sub / "a.kv.1.tmp", sub / "b.kv.2.tmp"
    stale.write_bytes(b"")
    fresh.write_bytes(b"")
    old = time.time() - STALE_TMP_S - 10
    os.utime(stale, (old, old))
    assert scan_blocks(model_dir(tmp_path, MODEL)) == [(1, 5)]
    assert (stale.exists(), fresh.exists()) == (False, True)


async def test_reads_files_written_by_another_process(tmp_path: Path) -> None:
    a = await SsdTier.open(config(tmp_path, 10))
    b = await SsdTier.open(config(tmp_path, 10))
    await a.put_many([(5, value(5))])
    assert await b.contains_prefix([5]) == 1
    assert await b.get_many([5]) == [value(5)]
    assert b.used_bytes == SIZE  # now accounted for in b's LRU too
    await a.aclose()
    await b.aclose()


async def test_damaged_file_is_deleted(tmp_path: Path) -> None:
    tier = await SsdTier.open(config(tmp_path, 10))
    await tier.put_many([(6, value(6))])
    path = block_path(tmp_path, MODEL, 6)
    path.write_bytes(path.read_bytes()[:-3])
    assert await tier.get_many([6]) == [None]
    assert not path.exists()
    assert tier.used_bytes == 0
    await tier.aclose()


@pytest.mark.parametrize("model", ["", ".", ".."])
def test_model_ids_that_escape_the_directory_are_rejected(tmp_path: Path, model: str) -> None:
    with pytest.raises(ValueError, match="cannot name a directory"):
        SsdTier(SsdTierConfig(tmp_path, model, capacity_bytes=1))

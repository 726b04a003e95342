"""``BlockManager.import_blocks``: blocks pulled from a shared tier become ordinary prefix-cache hits."""

from __future__ import annotations

from kvgate_core.kvcontract.events import EventType, KVEvent
from kvgate_core.kvcontract.hashing import chain_hashes
from workers.engine.block_manager import BlockManager

ROOT = 7
TOKENS = list(range(1, 50))  # 49 tokens: 3 full blocks of 16
CHAIN = chain_hashes(TOKENS, ROOT, 16)


def test_imported_blocks_are_found_by_the_next_allocation() -> None:
    events: list[KVEvent] = []
    blocks = BlockManager(8, 16, on_event=events.append)
    ids = blocks.import_blocks(CHAIN, 0)
    assert len(ids) == 3 and None not in ids
    assert [blocks.block_of(h) for h in CHAIN] == ids
    assert [e.type for e in events] == [EventType.STORED] and list(events[0].hashes) == CHAIN
    assert blocks.allocate("s", len(TOKENS), CHAIN, ROOT) == 3
    assert list(blocks.block_table("s"))[:3] == ids


def test_hashes_already_cached_are_not_rewritten() -> None:
    blocks = BlockManager(8, 16)
    first = blocks.import_blocks(CHAIN[:2], 0)
    again = blocks.import_blocks(CHAIN, 0)
    assert again[:2] == [None, None] and again[2] is not None and again[2] not in first


def test_the_local_prefix_is_never_evicted_and_a_full_pool_stops_early() -> None:
    blocks = BlockManager(3, 16)
    blocks.import_blocks(CHAIN[:1], 0)  # the "local" prefix: block 0 of the chain
    other = chain_hashes(list(range(100, 132)), ROOT, 16)
    blocks.import_blocks(other, 0)  # fills the two other blocks with an unrelated prefix
    ids = blocks.import_blocks(CHAIN, 1)  # may evict the unrelated blocks, never CHAIN[0]
    assert len(ids) == 2 and None not in ids
    assert blocks.block_of(CHAIN[0]) is not None
    assert blocks.block_of(other[0]) is None and blocks.block_of(other[1]) is None
    assert blocks.num_cached_prefix_blocks(CHAIN, len(TOKENS)) == 3
    tiny = BlockManager(2, 16)
    assert len(tiny.import_blocks(CHAIN, 0)) == 2  # ran out of blocks: a shorter prefix

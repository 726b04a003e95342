"""BlockManager: prefix reuse, LRU eviction, events, and invariants under random workloads."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from kvgate_core.kvcontract.events import EventType, KVEvent
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from workers.engine.block_manager import BlockManager, NoFreeBlocksError

BS = 4
ROOT = root_hash("m")


def _hashes(tokens: list[int]) -> list[int]:
    return chain_hashes(tokens, ROOT, BS)


def _manager(num_blocks: int, events: list[KVEvent] | None = None) -> BlockManager:
    sink = events.append if events is not None else None
    return BlockManager(num_blocks, BS, on_event=sink, worker_id="w1", clock=lambda: 1.0)


def _run(bm: BlockManager, seq: str, tokens: list[int]) -> int:
    hit = bm.allocate(seq, len(tokens), _hashes(tokens), ROOT)
    bm.commit(seq, tokens)
    return hit


def test_repeated_prefix_hits_cached_blocks_after_free():
    bm = _manager(8)
    tokens = list(range(10))  # two full blocks and a partial one
    assert _run(bm, "a", tokens) == 0
    bm.free("a")
    assert bm.num_cached_blocks == 2
    assert _run(bm, "b", [*tokens[:8], 99, 98]) == 2


def test_hit_is_capped_so_one_prompt_token_is_computed():
    bm = _manager(8)
    tokens = list(range(8))
    _run(bm, "a", tokens)
    bm.free("a")
    assert _run(bm, "b", tokens) == 1


def test_shared_blocks_are_reference_counted():
    bm = _manager(8)
    tokens = list(range(9))
    _run(bm, "a", tokens)
    assert _run(bm, "b", tokens) == 2
    shared = bm.block_table("a")[0]
    assert bm.block_table("b")[0] == shared
    assert bm.ref_count(shared) == 2
    bm.free("a")
    assert bm.ref_count(shared) == 1


def test_events_report_stored_then_removed_on_reuse():
    events: list[KVEvent] = []
    bm = _manager(2, events)
    _run(bm, "a", list(range(8)))
    stored = _hashes(list(range(8)))
    assert events == [KVEvent("w1", EventType.STORED, hashes=tuple(stored), ts=1.0)]
    bm.free("a")
    _run(bm, "b", [50, 51, 52])
    assert events[-1].type is EventType.REMOVED
    # The tail block is evicted first: the shared head survives longer.
    assert events[-1].hashes == (stored[1],)


def test_allocate_without_room_changes_nothing():
    bm = _manager(2)
    _run(bm, "a", list(range(5)))
    with pytest.raises(NoFreeBlocksError):
        bm.allocate("b", 5, _hashes([7] * 5), ROOT)
    assert bm.num_free_blocks == 0
    assert not bm.has_sequence("b")


def test_append_slots_grows_and_commit_hashes_decode_blocks():
    events: list[KVEvent] = []
    bm = _manager(4, events)
    tokens = [1, 2, 3]
    bm.allocate("a", 3, [], ROOT)
    for t in range(4, 10):
        tokens.append(t)
        assert bm.append_slots("a", len(tokens))
        bm.commit("a", tokens)
    assert len(bm.block_table("a")) == 3
    assert [h for e in events for h in e.hashes] == _hashes(tokens)


def test_append_slots_reports_exhaustion():
    bm = _manager(1)
    bm.allocate("a", 4, _hashes([1, 2, 3, 4]), ROOT)
    assert not bm.append_slots("a", 5)
    assert len(bm.block_table("a")) == 1


def test_duplicate_concurrent_prompt_registers_hash_once():
    events: list[KVEvent] = []
    bm = _manager(8, events)
    tokens = list(range(9))
    bm.allocate("a", 9, _hashes(tokens), ROOT)
    bm.allocate("b", 9, _hashes(tokens), ROOT)  # before a's KV is committed: no hit
    bm.commit("a", tokens)
    bm.commit("b", tokens)
    assert sum(len(e.hashes) for e in events) == 2
    bm.free("a")
    bm.free("b")
    assert bm.num_free_blocks == 8


def test_invalid_arguments_are_rejected():
    bm = _manager(4)
    with pytest.raises(ValueError, match="one hash per full block"):
        bm.allocate("a", 8, [], ROOT)
    bm.allocate("a", 2, [], ROOT)
    with pytest.raises(ValueError, match="cannot allocate"):
        bm.allocate("a", 2, [], ROOT)


# -- property test ----------------------------------------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 3), st.integers(1, 14)),
        st.tuples(st.just("grow"), st.integers(0, 40), st.integers(1, 6)),
        st.tuples(st.just("free"), st.integers(0, 40), st.just(0)),
    ),
    max_size=60,
)


def _check_invariants(bm: BlockManager, live: dict[str, list[int]], events: list[KVEvent]) -> None:
    refs = Counter(b for seq in live for b in bm.block_table(seq))
    for block_id in range(bm.num_total_blocks):
        assert bm.ref_count(block_id) == refs[block_id] >= 0
    assert bm.num_free_blocks == bm.num_total_blocks - len(refs)
    replay: set[int] = set()
    for e in events:
        if e.type is EventType.STORED:
            assert not replay & set(e.hashes)
            replay |= set(e.hashes)
        else:
            assert set(e.hashes) <= replay
            replay -= set(e.hashes)
    assert replay == set(bm.cached_hashes())


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_random_workload_keeps_invariants(ops):
    events: list[KVEvent] = []
    bm = _manager(12, events)
    live: dict[str, list[int]] = {}
    for n, (op, a, b) in enumerate(ops):
        if op == "alloc":
            tokens = [a] * 4 + list(range(100 + n, 100 + n + b))  # 4 prefixes share their first block
            if bm.can_allocate(len(tokens), _hashes(tokens)):
                expected_hit = bm.num_cached_prefix_blocks(_hashes(tokens), len(tokens))
                assert _run(bm, f"s{n}", tokens) == expected_hit
                live[f"s{n}"] = tokens
            else:
                with pytest.raises(NoFreeBlocksError):
                    bm.allocate(f"s{n}", len(tokens), _hashes(tokens), ROOT)
        elif live:
            seq = sorted(live)[a % len(live)]
            if op == "grow":
                tokens = live[seq] + [7] * b
                if bm.append_slots(seq, len(tokens)):
                    bm.commit(seq, tokens)
                    live[seq] = tokens
            else:
                cached_before = set(bm.cached_hashes())
                bm.free(seq)
                del live[seq]
                # Freeing drops no cached block: they stay findable until reused (a REMOVED event).
                assert set(bm.cached_hashes()) == cached_before
        _check_invariants(bm, live, events)
    for seq in list(live):
        bm.free(seq)
    assert bm.num_free_blocks == bm.num_total_blocks

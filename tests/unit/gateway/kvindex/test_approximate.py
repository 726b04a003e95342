from __future__ import annotations

import random

from gateway.kvindex.approximate import ApproximateIndexConfig, ApproximateKVIndex
from kvgate_core.kvcontract.events import EventType, KVEvent


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_routed_blocks_count_as_cached_until_ttl() -> None:
    clock = FakeClock()
    index = ApproximateKVIndex(ApproximateIndexConfig(ttl_s=10.0), clock=clock)
    index.record_routed("a", [1, 2, 3])
    assert index.longest_prefix([1, 2, 3, 9], ["a", "b"])["a"].gpu_blocks == 3
    assert index.longest_prefix([1, 2, 3, 9], ["a", "b"])["b"].gpu_blocks == 0
    clock.now = 10.5
    assert index.longest_prefix([1, 2, 3], ["a"])["a"].gpu_blocks == 0
    assert index.num_blocks() == 0


def test_capacity_evicts_least_recently_routed_blocks() -> None:
    index = ApproximateKVIndex(ApproximateIndexConfig(capacity_blocks=4), clock=FakeClock())
    index.record_routed("a", [1, 2, 3])
    index.record_routed("a", [1, 7, 8])  # 1 refreshed; of [1, 2, 3] the deepest block, 3, goes first
    assert index.num_blocks() == 4
    assert index.longest_prefix([1, 2, 3], ["a"])["a"].gpu_blocks == 2
    assert index.longest_prefix([1, 7, 8], ["a"])["a"].gpu_blocks == 3


def test_a_prompt_that_does_not_fit_keeps_its_leading_blocks() -> None:
    index = ApproximateKVIndex(ApproximateIndexConfig(capacity_blocks=3), clock=FakeClock())
    index.record_routed("a", [1, 2, 3, 4, 5])
    assert index.longest_prefix([1, 2, 3, 4, 5], ["a"])["a"].gpu_blocks == 3


def test_removed_and_cleared_events_correct_the_guess() -> None:
    index = ApproximateKVIndex(clock=FakeClock())
    index.record_routed("a", [1, 2, 3])
    index.apply(KVEvent(worker="a", type=EventType.REMOVED, hashes=(2,)))
    assert index.longest_prefix([1, 2, 3], ["a"])["a"].gpu_blocks == 1
    index.apply(KVEvent(worker="a", type=EventType.CLEARED))
    assert index.longest_prefix([1], ["a"])["a"].gpu_blocks == 0


def test_worker_blocks_are_the_blocks_assumed_per_worker() -> None:
    index = ApproximateKVIndex(ApproximateIndexConfig(capacity_blocks=4), clock=FakeClock())
    index.record_routed("a", [1, 2, 3])
    index.record_routed("a", [1, 7, 8])
    index.record_routed("b", [1])
    assert index.worker_blocks() == {"a": 4, "b": 1}
    index.remove_worker("a")
    assert index.worker_blocks() == {"b": 1}


def test_under_churn_it_matches_a_plain_lru_per_worker_and_keeps_no_stray_entries() -> None:
    """Random prefix chains routed to three small workers, with time passing: every lookup agrees with a
    per-worker LRU + TTL model (a prompt's blocks refreshed deepest first), and the block -> workers mask holds exactly the blocks some worker keeps."""
    rng = random.Random(7)
    clock = FakeClock()
    index = ApproximateKVIndex(ApproximateIndexConfig(capacity_blocks=40, ttl_s=30.0), clock=clock)
    model: dict[str, dict[int, float]] = {w: {} for w in "abc"}  # insertion order = LRU order
    for step in range(600):
        clock.now += rng.random()
        worker = rng.choice("abc")
        root = rng.randrange(12)
        chain = [root * 1000 + i for i in range(rng.randrange(1, 25))]
        index.record_routed(worker, chain)
        lru = model[worker]
        for h in reversed(chain):  # a prompt's first block is its most recent
            lru.pop(h, None)
            lru[h] = clock.now
        for blocks in model.values():
            for h in [h for h, t in blocks.items() if t <= clock.now - 30.0]:
                del blocks[h]
            while len(blocks) > 40:
                del blocks[next(iter(blocks))]
        probe_root = root if step % 2 else rng.randrange(12)
        probe = [probe_root * 1000 + i for i in range(25)]
        hits = index.longest_prefix(probe, list("abc"))
        for w, blocks in model.items():
            expected = 0
            while expected < len(probe) and probe[expected] in blocks:
                expected += 1
            assert hits[w].gpu_blocks == expected, (step, w)
    assert index.worker_blocks() == {w: len(b) for w, b in model.items()}
    held = set().union(*(b.keys() for b in model.values()))
    assert set(index._mask) == held

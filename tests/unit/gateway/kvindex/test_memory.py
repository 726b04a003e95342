from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings, strategies as st

from gateway.kvindex.index import PrefixHit
from gateway.kvindex.memory import MemoryIndexConfig, MemoryKVIndex
from kvgate_core.kvcontract.events import EventType, KVEvent, Tier


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stored(worker: str, hashes: Iterable[int], tier: Tier = Tier.GPU) -> KVEvent:
    return KVEvent(worker=worker, type=EventType.STORED, tier=tier, hashes=tuple(hashes))


def removed(worker: str, hashes: Iterable[int], tier: Tier = Tier.GPU) -> KVEvent:
    return KVEvent(worker=worker, type=EventType.REMOVED, tier=tier, hashes=tuple(hashes))


def test_prediction_counts_until_ttl_then_expires() -> None:
    clock = FakeClock()
    index = MemoryKVIndex(MemoryIndexConfig(prediction_ttl_s=2.0), clock=clock)
    index.record_routed("a", [1, 2, 3])
    assert index.longest_prefix([1, 2, 3, 4], ["a", "b"])["a"] == PrefixHit(3, 0)
    clock.now += 2.5
    assert index.longest_prefix([1, 2, 3, 4], ["a"])["a"] == PrefixHit(0, 0)
    assert index.num_predictions() == 0


def test_refreshed_prediction_outlives_its_first_ttl() -> None:
    clock = FakeClock()
    index = MemoryKVIndex(MemoryIndexConfig(prediction_ttl_s=2.0), clock=clock)
    index.record_routed("a", [1, 2])
    clock.now += 1.5
    index.record_routed("a", [1, 2])
    clock.now += 1.0
    assert index.longest_prefix([1, 2], ["a"])["a"].gpu_blocks == 2


def test_removed_event_supersedes_prediction() -> None:
    clock = FakeClock()
    index = MemoryKVIndex(clock=clock)
    index.record_routed("a", [1, 2, 3])
    index.apply(removed("a", [2]))
    assert index.longest_prefix([1, 2, 3], ["a"])["a"].gpu_blocks == 1


def test_prediction_entries_are_bounded() -> None:
    index = MemoryKVIndex(MemoryIndexConfig(max_predictions=10), clock=FakeClock())
    for i in range(20):
        index.record_routed("a", [i * 3, i * 3 + 1, i * 3 + 2])
    assert index.num_predictions() <= 10
    assert index.longest_prefix([57, 58, 59], ["a"])["a"].gpu_blocks == 3


def test_a_routed_prompt_predicts_only_the_blocks_its_worker_is_not_known_to_hold() -> None:
    clock = FakeClock()
    index = MemoryKVIndex(MemoryIndexConfig(prediction_ttl_s=2.0), clock=clock)
    index.apply(stored("a", [1, 2, 3]))
    index.record_routed("a", [1, 2, 3, 4, 5])  # the next turn: the history is on "a" already
    assert index.num_predictions() == 2
    assert index.longest_prefix([1, 2, 3, 4, 5, 6], ["a", "b"]) == {
        "a": PrefixHit(5, 0),
        "b": PrefixHit(0, 0),
    }
    index.record_routed("b", [1, 2, 3, 4])  # "b" holds none of it: all predicted
    assert index.num_predictions() == 6
    # a hole in what "a" holds: everything from the hole on is predicted, the block after it included
    index.apply(removed("a", [2]))
    index.record_routed("a", [1, 2, 3])
    assert index.longest_prefix([1, 2, 3], ["a"])["a"] == PrefixHit(3, 0)
    clock.now += 2.5  # predictions gone: events alone speak
    assert index.longest_prefix([1, 2, 3], ["a"])["a"] == PrefixHit(1, 0)
    assert index.num_predictions() == 0


def test_a_prompt_that_touches_no_prediction_reads_events_alone() -> None:
    index = MemoryKVIndex(clock=FakeClock())
    index.apply(stored("a", [1, 2, 3]))
    index.record_routed("b", [7, 8])  # live predictions elsewhere
    assert index.longest_prefix([1, 2, 3], ["a", "b"]) == {"a": PrefixHit(3, 0), "b": PrefixHit(0, 0)}
    assert index.longest_prefix([7, 8, 9], ["a", "b"]) == {"a": PrefixHit(0, 0), "b": PrefixHit(2, 0)}


def test_cleared_dram_tier_keeps_gpu_entries() -> None:
    index = MemoryKVIndex()
    index.apply(stored("a", [1, 2]))
    index.apply(stored("a", [3, 4], Tier.DRAM))
    assert index.longest_prefix([1, 2, 3, 4], ["a"])["a"] == PrefixHit(2, 2)
    index.apply(KVEvent(worker="a", type=EventType.CLEARED, tier=Tier.DRAM))
    assert index.longest_prefix([1, 2, 3, 4], ["a"])["a"] == PrefixHit(2, 0)


def test_worker_bit_is_reused_without_leaking_old_entries() -> None:
    index = MemoryKVIndex()
    index.apply(stored("a", [1, 2]))
    index.remove_worker("a")
    index.apply(stored("b", [5]))
    assert index.longest_prefix([1, 2], ["b"])["b"].gpu_blocks == 0
    assert index.num_blocks() == 1


def test_eviction_calls_metric_hook_with_counts() -> None:
    evicted: list[int] = []
    index = MemoryKVIndex(MemoryIndexConfig(max_blocks=100), on_evict=evicted.append)
    index.apply(stored("a", range(150)))
    assert sum(evicted) == 50
    assert index.num_blocks() == 100
    # Within one event the chain's tail is older than its head: eviction shortens the match.
    assert index.longest_prefix(list(range(150)), ["a"])["a"].gpu_blocks == 100
    index.apply(stored("b", range(1000, 1100)))  # a newer chain pushes the older one out entirely
    assert index.longest_prefix(list(range(150)), ["a"])["a"].gpu_blocks == 0
    assert index.longest_prefix(list(range(1000, 1100)), ["b"])["b"].gpu_blocks == 100


def test_churn_of_a_million_blocks_stays_within_budget() -> None:
    budget = 50_000
    evicted: list[int] = []
    index = MemoryKVIndex(MemoryIndexConfig(max_blocks=budget), on_evict=evicted.append)
    workers = [f"w{i}" for i in range(8)]
    peak = 0
    for batch in range(1_000):
        base = batch * 1_000
        index.apply(stored(workers[batch % 8], range(base, base + 1_000)))
        if batch % 3 == 0:
            index.apply(removed(workers[batch % 8], range(base, base + 100)))
        peak = max(peak, index.num_blocks())
    assert peak <= budget
    assert sum(evicted) >= 1_000_000 - budget - 34_000
    recent = list(range(998_000, 999_000))  # batch 998: stored, nothing removed
    assert index.longest_prefix(recent, workers)[workers[998 % 8]].gpu_blocks == 1_000
    assert index.longest_prefix(list(range(1_000)), workers) == dict.fromkeys(workers, PrefixHit())


def naive(index_events: dict[str, set[int]], hashes: list[int], worker: str) -> int:
    n = 0
    for h in hashes:
        if h not in index_events.get(worker, set()):
            break
        n += 1
    return n


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(), st.lists(st.integers(0, 15), max_size=6)),
        max_size=30,
    ),
    query=st.lists(st.integers(0, 15), max_size=12),
)
def test_lookup_matches_a_naive_model(ops: list[tuple[str, bool, list[int]]], query: list[int]) -> None:
    index = MemoryKVIndex()
    model: dict[str, set[int]] = {}
    for worker, is_store, hashes in ops:
        if is_store:
            index.apply(stored(worker, hashes))
            model.setdefault(worker, set()).update(hashes)
        else:
            index.apply(removed(worker, hashes))
            model.setdefault(worker, set()).difference_update(hashes)
    hits = index.longest_prefix(query, ["a", "b", "c", "d"])
    for worker in ["a", "b", "c", "d"]:
        assert hits[worker].gpu_blocks == naive(model, query, worker), worker
        assert index.worker_blocks().get(worker, 0) == len(model.get(worker, ())), worker


def test_worker_blocks_shrink_when_the_budget_evicts() -> None:
    index = MemoryKVIndex(MemoryIndexConfig(max_blocks=3))
    index.apply(stored("a", [1, 2]))
    index.apply(stored("b", [2, 3, 4]))
    assert index.num_blocks() == 3
    assert index.worker_blocks() == {"a": 1, "b": 3}  # block 1 went first; block 2 is both workers'
    assert index.blocks_of("a") == 1 and index.blocks_of("nobody") == 0

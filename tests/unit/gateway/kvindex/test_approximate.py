from __future__ import annotations

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
    index.record_routed("a", [1, 7, 8])  # 1 refreshed; 2 and 3 are the oldest
    assert index.num_blocks() == 4
    assert index.longest_prefix([1, 2], ["a"])["a"].gpu_blocks == 1
    assert index.longest_prefix([1, 7, 8], ["a"])["a"].gpu_blocks == 3


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

"""The index mode follows each worker: precise where its events flow, approximate where none do."""

from __future__ import annotations

from gateway.kvindex.approximate import ApproximateIndexConfig, ApproximateKVIndex
from gateway.kvindex.hybrid import HybridKVIndex
from gateway.kvindex.index import PrefixHit
from gateway.kvindex.memory import MemoryIndexConfig, MemoryKVIndex
from kvgate_core.kvcontract.events import EventType, KVEvent

HASHES = (11, 22, 33)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _index(default: str = "approximate", clock: Clock | None = None) -> HybridKVIndex:
    clock = clock or Clock()
    return HybridKVIndex(
        MemoryKVIndex(MemoryIndexConfig(), clock=clock),
        ApproximateKVIndex(ApproximateIndexConfig(capacity_blocks=8, ttl_s=300), clock=clock),
        default="approximate" if default == "approximate" else "precise",
    )


def _stored(worker: str, hashes: tuple[int, ...] = HASHES) -> KVEvent:
    return KVEvent(worker=worker, type=EventType.STORED, hashes=hashes)


def test_a_worker_without_events_learns_its_placement_from_routing_and_keeps_it() -> None:
    clock = Clock()
    index = _index(clock=clock)
    index.record_routed("tgi", HASHES)
    clock.now += 120  # far past the precise index's 2 s prediction lifetime
    assert index.longest_prefix(HASHES, ["tgi"]) == {"tgi": PrefixHit(gpu_blocks=3)}
    assert index.worker_blocks() == {"tgi": 3}


def test_a_worker_with_a_feed_is_answered_from_its_events_only() -> None:
    clock = Clock()
    index = _index(clock=clock)
    index.record_routed("vllm", HASHES)  # learned while approximate
    assert index.set_mode("vllm", "precise")
    assert index.longest_prefix(HASHES, ["vllm"])["vllm"] == PrefixHit()  # the guess is gone
    index.apply(_stored("vllm", HASHES[:2]))
    index.record_routed("vllm", HASHES)  # a short prediction now
    clock.now += 120
    assert index.longest_prefix(HASHES, ["vllm"])["vllm"] == PrefixHit(gpu_blocks=2)


def test_a_quiet_feed_falls_back_to_routing_and_its_events_resume_when_it_flows() -> None:
    index = _index()
    index.set_mode("vllm", "precise")
    index.apply(_stored("vllm", HASHES[:1]))
    index.set_mode("vllm", "approximate")  # quiet
    assert index.longest_prefix(HASHES, ["vllm"])["vllm"] == PrefixHit()
    index.record_routed("vllm", HASHES)
    assert index.longest_prefix(HASHES, ["vllm"])["vllm"] == PrefixHit(gpu_blocks=3)
    index.set_mode("vllm", "precise")  # flowing again: its event blocks were kept
    assert index.longest_prefix(HASHES, ["vllm"])["vllm"] == PrefixHit(gpu_blocks=1)


def test_none_mode_gives_no_hits_and_precise_is_the_default_under_the_precise_override() -> None:
    index = _index(default="precise")
    assert not index.follows_fleet and index.mode("w") == "precise"
    index.apply(_stored("w"))
    index.set_mode("w", "none")
    assert index.longest_prefix(HASHES, ["w"]) == {"w": PrefixHit()}
    assert index.worker_blocks() == {}


def test_modes_are_answered_side_by_side_and_a_removed_worker_is_forgotten() -> None:
    index = _index()
    index.set_mode("p", "precise")
    index.apply(_stored("p", HASHES[:1]))
    index.record_routed("a", HASHES)
    hits = index.longest_prefix(HASHES, ["p", "a", "x"])
    assert hits == {"p": PrefixHit(gpu_blocks=1), "a": PrefixHit(gpu_blocks=3), "x": PrefixHit()}
    assert index.num_blocks() == 4
    index.remove_worker("p")
    index.remove_worker("a")
    assert index.num_blocks() == 0 and index.modes() == {}


def test_an_engines_capacity_bounds_what_is_assumed_of_it() -> None:
    approx = ApproximateKVIndex(ApproximateIndexConfig(capacity_blocks=100))
    approx.record_routed("small", tuple(range(10)))
    approx.set_capacity("small", 4)  # its engine holds 4 of the gateway's blocks
    assert approx.worker_blocks() == {"small": 4}
    approx.record_routed("small", tuple(range(20, 30)))
    assert approx.worker_blocks() == {"small": 4}
    # the prompt's leading blocks stay, as an engine keeps a prefix and frees its tail first
    assert approx.longest_prefix((20, 21, 22, 23, 24), ["small"])["small"] == PrefixHit(gpu_blocks=4)
    approx.forget("small")  # placement forgotten, capacity kept
    approx.record_routed("small", tuple(range(10)))
    assert approx.worker_blocks() == {"small": 4} and approx.capacity("small") == 4

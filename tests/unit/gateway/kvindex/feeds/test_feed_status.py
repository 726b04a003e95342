"""Feed status: connecting → flowing → quiet → flowing, with an injected clock, and the worker callbacks."""

from __future__ import annotations

import logging

import pytest

from gateway.kvindex.feeds.feed_status import FeedStatus, WorkerFeeds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_source_without_batches_turns_quiet_after_the_start(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    status = FeedStatus("tcp://w:5557", clock=clock, quiet_after_s=60)
    clock.now += 59
    status.tick()
    states = [status.state]
    clock.now += 1
    with caplog.at_level(logging.WARNING):
        status.tick()
        status.tick()
    states.append(status.state)
    assert states == ["connecting", "quiet"]
    assert len([r for r in caplog.records if "quiet" in r.getMessage()]) == 1


def test_batches_keep_it_flowing_and_bring_it_back() -> None:
    clock = Clock()
    changes: list[str] = []
    status = FeedStatus("s", clock=clock, quiet_after_s=10, on_change=changes.append)
    status.note_batch()
    clock.now += 9
    status.tick()
    status.note_batch()
    clock.now += 9
    status.tick()
    assert status.state == "flowing"
    clock.now += 1
    status.tick()
    status.note_batch()
    status.stop()
    assert changes == ["flowing", "quiet", "flowing", "stopped"]
    assert status.as_dict() | {"skipped": {}} == {
        "source": "s", "state": "stopped", "last_event_at": 119.0, "last_event_age_s": 0.0, "last_seq": -1,
        "num_batches": 3, "num_bad_batches": 0, "num_gaps": 0, "num_replays": 0, "num_resyncs": 0,
        "skipped": {},
    }  # fmt: skip


def test_a_worker_is_quiet_when_any_source_is_and_callbacks_fire_on_changes() -> None:
    clock = Clock()
    calls: list[tuple[str, str]] = []
    feeds = WorkerFeeds(
        "w1",
        "vllm",
        on_quiet=lambda w: calls.append(("quiet", w)),
        on_flowing=lambda w: calls.append(("flow", w)),
    )
    rank0 = feeds.add_source("tcp://h:5557", clock=clock, quiet_after_s=10)
    rank1 = feeds.add_source("tcp://h:5558", clock=clock, quiet_after_s=10, skipped={"partial": 2})
    assert (feeds.state, feeds.trusted) == ("connecting", True)
    rank0.note_batch()
    rank1.note_batch()
    clock.now += 10
    rank0.note_batch()
    rank1.tick()
    assert (feeds.state, feeds.trusted) == ("quiet", False)
    rank1.note_batch()
    assert calls == [("flow", "w1"), ("quiet", "w1"), ("flow", "w1")]
    assert feeds.as_dict()["sources"][1]["skipped"] == {"partial": 2}
    rank0.stop()
    rank1.stop()
    assert (feeds.state, feeds.trusted) == ("stopped", False)


def test_with_activity_an_idle_engine_is_never_quiet_but_one_that_served_without_events_is() -> None:
    clock = Clock()
    routed = [0]
    status = FeedStatus("s", clock=clock, quiet_after_s=10, activity=lambda: routed[0])
    status.note_batch()
    clock.now += 1000  # idle: nothing routed there, nothing published
    status.tick()
    assert status.state == "flowing"
    routed[0] = 3  # requests went there; silence counts from the first tick that sees them
    status.tick()
    clock.now += 9
    status.tick()
    assert status.state == "flowing"
    clock.now += 1
    status.tick()
    assert status.state == "quiet"
    status.note_batch()  # events again: flowing, and the pending clock starts over
    assert status.state == "flowing"
    clock.now += 100
    status.tick()
    assert status.state == "flowing"

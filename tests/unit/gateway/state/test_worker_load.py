"""``WorkerLoad`` behaves as the frozen value it replaced: equal, hashed and printed by value."""

from __future__ import annotations

import pytest

from gateway.state.protocols import WorkerLoad


def test_equal_and_hashed_by_value() -> None:
    a = WorkerLoad(2, 30, recent_tokens=1.5, recent_follow_ups=0.25)
    b = WorkerLoad(inflight_requests=2, inflight_tokens=30, recent_tokens=1.5, recent_follow_ups=0.25)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != WorkerLoad(2, 31, recent_tokens=1.5, recent_follow_ups=0.25)
    assert a != (2, 30, 1.5, 0.0, 0.0, 0.0, 0.25)  # not a tuple
    assert a.astuple() == (2, 30, 1.5, 0.0, 0.0, 0.0, 0.25)


def test_defaults_are_an_idle_worker() -> None:
    assert WorkerLoad().astuple() == (0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_repr_names_every_field() -> None:
    text = repr(WorkerLoad(1, 2, 3.0, 4.0, 5.0, 6.0, 7.0))
    assert text == (
        "WorkerLoad(inflight_requests=1, inflight_tokens=2, recent_tokens=3.0, recent_requests=4.0, "
        "recent_cached_tokens=5.0, recent_streams=6.0, recent_follow_ups=7.0)"
    )


def test_no_other_attribute_can_be_set() -> None:
    load = WorkerLoad()
    with pytest.raises(AttributeError):
        load.extra = 1  # type: ignore[attr-defined]

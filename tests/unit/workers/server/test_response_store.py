"""``ResponseStore``: LRU bound by count, time to live, delete."""

from __future__ import annotations

import pytest

from workers.server.response_store import ResponseStore, StoredResponse


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _entry(name: str) -> StoredResponse:
    return StoredResponse({"id": name}, ({"role": "user", "content": name},))


def test_least_recently_used_entry_is_evicted_beyond_the_bound() -> None:
    store = ResponseStore(max_entries=2)
    store.put("a", _entry("a"))
    store.put("b", _entry("b"))
    assert store.get("a") is not None  # "b" is now the least recently used
    store.put("c", _entry("c"))
    assert len(store) == 2
    assert store.get("b") is None
    assert store.get("a") is not None and store.get("c") is not None


def test_entries_expire_after_the_ttl() -> None:
    clock = FakeClock()
    store = ResponseStore(max_entries=8, ttl_s=10.0, clock=clock)
    store.put("a", _entry("a"))
    clock.now = 9.9
    assert store.get("a") == _entry("a")
    clock.now = 10.0
    assert store.get("a") is None
    assert len(store) == 0


def test_delete_reports_whether_a_live_entry_was_there() -> None:
    clock = FakeClock()
    store = ResponseStore(ttl_s=1.0, clock=clock)
    store.put("a", _entry("a"))
    store.put("b", _entry("b"))
    assert store.delete("a") is True
    assert store.delete("a") is False
    clock.now = 5.0
    assert store.delete("b") is False  # expired
    assert len(store) == 0


def test_a_zero_sized_store_keeps_nothing() -> None:
    store = ResponseStore(max_entries=0)
    store.put("a", _entry("a"))
    assert store.get("a") is None


@pytest.mark.parametrize(("size", "ttl"), [(-1, 1.0), (1, 0.0)], ids=["negative-size", "zero-ttl"])
def test_bad_bounds_are_refused(size: int, ttl: float) -> None:
    with pytest.raises(ValueError, match="max_entries"):
        ResponseStore(size, ttl)

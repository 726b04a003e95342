"""EventHub fan-out and the engine value types' validation."""

from __future__ import annotations

import pytest

from kvgate_core.kvcontract.events import EventType, KVEvent
from workers.engine_api import EventHub, InvalidRequestError, SamplingParams


def _event(h: int) -> KVEvent:
    return KVEvent("w", EventType.STORED, hashes=(h,))


async def test_every_subscriber_gets_events_published_after_it_subscribed():
    hub = EventHub()
    hub.publish(_event(0))
    a, b = hub.subscribe(), hub.subscribe()
    hub.publish(_event(1))
    hub.publish(_event(2))
    assert [(await anext(a)).hashes, *(e.hashes for e in a.drain())] == [(1,), (2,)]
    assert (await anext(b)).hashes == (1,)
    await a.aclose()
    assert hub.num_subscribers == 1


async def test_a_subscriber_that_falls_behind_is_dropped_not_waited_for():
    hub = EventHub(max_queue=3)
    slow, fresh = hub.subscribe(), hub.subscribe()
    for i in range(5):
        hub.publish(_event(i))
        if i < 4:
            assert (await anext(fresh)).hashes == (i,)
    assert [e.hashes for e in slow.drain()] == [(0,), (1,)]
    with pytest.raises(StopAsyncIteration):
        await anext(slow)
    assert hub.num_subscribers == 1


async def test_close_ends_every_subscription():
    hub = EventHub()
    sub = hub.subscribe()
    hub.close()
    assert [e async for e in sub] == []


@pytest.mark.parametrize(
    "kwargs",
    [{"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}],
    ids=["max_tokens", "temperature", "top_p"],
)
def test_sampling_params_reject_bad_values(kwargs):
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)

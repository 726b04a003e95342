"""``Deadline``: ``asyncio.timeout``'s behaviour, with later reschedules that arm no timer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from kvgate_core.deadline import Deadline, DeadlineWheel

pytestmark = pytest.mark.timeout(10)

MakeDeadline = Callable[[float], Deadline]


@pytest.fixture(params=["own timer", "wheel"])
def make(request: pytest.FixtureRequest) -> MakeDeadline:
    """A deadline with a timer of its own, or on a shared wheel (5 ms buckets)."""
    if request.param == "own timer":
        return Deadline
    wheel = DeadlineWheel(0.005)
    return lambda delay_s: Deadline(delay_s, wheel)


async def test_the_block_ends_in_timeout_error_when_the_deadline_passes(make: MakeDeadline) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with make(0.05) as d:
            await asyncio.sleep(5)
    assert d.expired()
    assert 0.04 <= loop.time() - start < 1.0


async def test_a_block_that_ends_in_time_leaves_no_timer_and_no_cancellation(make: MakeDeadline) -> None:
    async with make(0.05) as d:
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)  # past the deadline: nothing fires
    assert not d.expired()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_rescheduled_later_it_waits_for_the_last_time_given(make: MakeDeadline) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    pushed = []

    async def chunks() -> None:
        async with make(0.05) as d:
            for _ in range(6):  # an idle deadline pushed on by each chunk
                await asyncio.sleep(0.03)
                d.reschedule(loop.time() + 0.05)
            pushed.append(not d.expired())
            await asyncio.sleep(5)

    with pytest.raises(TimeoutError):
        await chunks()
    assert pushed == [True]
    assert loop.time() - start >= 0.18 + 0.05 - 0.01


async def test_rescheduled_earlier_it_fires_earlier(make: MakeDeadline) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def shortened() -> None:
        async with make(10) as d:
            d.reschedule(loop.time() + 0.05)
            await asyncio.sleep(5)

    with pytest.raises(TimeoutError):
        await shortened()
    assert loop.time() - start < 1.0


async def test_a_cancellation_from_elsewhere_is_not_turned_into_a_timeout(make: MakeDeadline) -> None:
    started = asyncio.Event()

    async def work() -> None:
        async with make(10):
            started.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(work())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_outer_cancel_at_expiry_stays_a_cancellation(make: MakeDeadline) -> None:
    """Expired and cancelled by someone else too: the block re-raises CancelledError, as asyncio.timeout."""

    async def work() -> None:
        async with make(0.01):
            try:
                await asyncio.sleep(5)
            finally:
                current = asyncio.current_task()
                assert current is not None
                current.cancel()  # another cancel request while the deadline's is handled

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(work())


async def test_nested_inside_asyncio_timeout_each_deadline_reports_its_own(make: MakeDeadline) -> None:
    outer = make(5)

    async def inner_deadline() -> None:
        async with asyncio.timeout(5), make(0.02):
            await asyncio.sleep(5)

    async def inner_timeout() -> None:
        async with outer, asyncio.timeout(0.02):
            await asyncio.sleep(5)

    with pytest.raises(TimeoutError):
        await inner_deadline()
    with pytest.raises(TimeoutError):
        await inner_timeout()
    assert not outer.expired()


async def test_reschedule_outside_the_block_is_an_error(make: MakeDeadline) -> None:
    d = make(1)
    with pytest.raises(RuntimeError):
        d.reschedule(0)
    async with d:
        pass
    with pytest.raises(RuntimeError):
        d.reschedule(0)
    with pytest.raises(RuntimeError):
        async with d:
            pass


async def test_many_deadlines_share_one_wheel_timer_and_leave_it_empty() -> None:
    loop = asyncio.get_running_loop()
    wheel = DeadlineWheel(0.005)
    timers_before = len(getattr(loop, "_scheduled", []))
    release = asyncio.Event()

    async def request() -> None:
        async with Deadline(60, wheel):
            await release.wait()

    tasks = [asyncio.create_task(request()) for _ in range(200)]
    await asyncio.sleep(0)  # each task runs to its wait
    assert len(wheel) == 200
    assert len(getattr(loop, "_scheduled", [])) - timers_before <= 1  # one timer, not 200 (asyncio loop)
    release.set()
    await asyncio.gather(*tasks)
    assert len(wheel) == 0


async def test_a_wheel_expires_each_deadline_at_its_own_time() -> None:
    loop = asyncio.get_running_loop()
    wheel = DeadlineWheel(0.005)
    start = loop.time()
    ended: dict[float, float] = {}

    async def wait(delay_s: float) -> None:
        try:
            async with Deadline(delay_s, wheel):
                await asyncio.sleep(5)
        except TimeoutError:
            ended[delay_s] = loop.time() - start

    await asyncio.gather(*(wait(d) for d in (0.2, 0.05, 0.1)))
    assert sorted(ended, key=ended.__getitem__) == [0.05, 0.1, 0.2]
    for delay_s, took in ended.items():
        assert delay_s - 0.001 <= took < delay_s + 0.5
    assert len(wheel) == 0


def test_a_wheel_moves_to_a_new_event_loop_once_the_old_ones_deadlines_are_gone() -> None:
    wheel = DeadlineWheel(0.005)

    async def expire() -> None:
        with contextlib.suppress(TimeoutError):
            async with Deadline(0.01, wheel):
                await asyncio.sleep(5)

    asyncio.run(expire())
    asyncio.run(expire())  # a second loop: the wheel serves it
    assert len(wheel) == 0


def test_a_wheel_needs_a_positive_resolution() -> None:
    with pytest.raises(ValueError, match="resolution"):
        DeadlineWheel(0)

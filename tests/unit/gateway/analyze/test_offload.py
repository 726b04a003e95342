"""``LargeBodyOffload``: large bodies run off the loop, their structure is bounded before parsing, and the
number waiting for the analysis thread is capped."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.analyze.offload import LargeBodyOffload
from gateway.errors import InvalidRequest, Overloaded
from gateway.settings import OffloadLimits


def test_only_bodies_above_the_threshold_are_large() -> None:
    offload = LargeBodyOffload(OffloadLimits(inline_bytes=10))
    assert not offload.is_large(b"x" * 10)
    assert offload.is_large(b"x" * 11)


def test_too_many_containers_are_refused_before_parsing() -> None:
    offload = LargeBodyOffload(OffloadLimits(max_containers=4))
    offload.check_structure(b'{"a":[{"b":1}],"c":[]}')  # 4: fine
    with pytest.raises(InvalidRequest) as caught:
        offload.check_structure(b'{"messages":[' + b'{"role":"user"},' * 4 + b"]}")
    assert caught.value.code == "too_many_objects"


async def test_work_runs_on_another_thread_while_the_loop_keeps_running() -> None:
    offload = LargeBodyOffload()
    release = threading.Event()
    ticks = 0

    def work() -> str:
        assert release.wait(5)
        return threading.current_thread().name

    async def ticker() -> None:
        nonlocal ticks
        while not release.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    tick_task = asyncio.create_task(ticker())
    asyncio.get_running_loop().call_later(0.2, release.set)
    name = await offload.run(work)
    await tick_task
    offload.close()
    assert name.startswith("kvgate-analyze")
    assert ticks >= 5  # the loop ran while the work waited


async def test_more_than_the_waiting_cap_is_refused_at_once() -> None:
    offload = LargeBodyOffload(OffloadLimits(threads=1, max_waiting=1))
    release = threading.Event()
    first = asyncio.ensure_future(offload.run(lambda: release.wait(5)))
    second = asyncio.ensure_future(offload.run(lambda: release.wait(5)))
    await asyncio.sleep(0.05)
    with pytest.raises(Overloaded):
        await offload.run(lambda: True)
    release.set()
    assert await first and await second
    assert await offload.run(lambda: True)  # room again
    offload.close()

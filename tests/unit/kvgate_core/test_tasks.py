"""``kvgate_core.tasks.current_task`` answers as ``asyncio.current_task`` does."""

from __future__ import annotations

import asyncio

import pytest

from kvgate_core.tasks import current_task


async def test_each_task_sees_itself() -> None:
    async def who() -> asyncio.Task[object] | None:
        await asyncio.sleep(0)
        return current_task()

    first, second = asyncio.create_task(who()), asyncio.create_task(who())
    assert await first is first and await second is second
    assert current_task() is asyncio.current_task()


def test_outside_a_running_loop_it_raises_as_asyncio_does() -> None:
    with pytest.raises(RuntimeError):
        current_task()

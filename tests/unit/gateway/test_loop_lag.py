"""The event-loop lag watcher reports how long a busy loop delayed its timer."""

from __future__ import annotations

import asyncio
import contextlib
import time

from gateway.observability.loop_lag import watch_loop_lag
from gateway.observability.metrics import Metrics


async def test_a_blocked_loop_shows_as_lag() -> None:
    seen: list[float] = []
    task = asyncio.create_task(watch_loop_lag(seen.append, interval_s=0.01))
    await asyncio.sleep(0.03)
    time.sleep(0.05)  # the loop is busy: the watcher's timer fires late  # noqa: ASYNC251
    await asyncio.sleep(0.03)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert seen and min(seen) >= 0.0
    assert max(seen) >= 0.04


def test_lag_is_exported() -> None:
    metrics = Metrics()
    metrics.loop_lag(0.003)
    text = metrics.render().decode()
    assert "kvgate_event_loop_lag_seconds_count 1.0" in text

"""Event-loop lag: how late a timer fires, i.e. how long the loop was busy with something else.

Everything the gateway does runs on one event loop, so a slow synchronous step (a large batch of KV events,
a huge prompt to tokenize, a GC pause) delays every request in flight. A sleeper that measures its own
overshoot sees those stalls wherever they come from; ``kvgate_event_loop_lag_seconds`` exports them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def watch_loop_lag(
    observe: Callable[[float], None],
    interval_s: float = 0.1,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Sleep ``interval_s`` forever (cancel to stop) and ``observe`` each wake-up's delay in seconds."""
    while True:
        start = clock()
        await asyncio.sleep(interval_s)
        observe(max(0.0, clock() - start - interval_s))

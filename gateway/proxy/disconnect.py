"""Run a proxy attempt so that a client disconnect cancels it (and with it the upstream request).

uvicorn does not fail ``send`` after the client left, so the only signal is ``http.disconnect`` on
``receive``; a watcher task waits for it while the attempt runs in its own task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from kvgate_core.asgi import Receive

T = TypeVar("T")


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(work: Coroutine[Any, Any, T], receive: Receive) -> T | None:
    """Await ``work``; return None if the client disconnected first (``work`` is then cancelled).

    Exceptions of ``work`` propagate unchanged.
    """
    loop = asyncio.get_running_loop()
    task = loop.create_task(work)
    watcher = loop.create_task(_wait_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    if task.cancelled():
        return None
    return task.result()

"""Run a proxy attempt so that a client disconnect cancels it (and with it the upstream request).
Compiled with mypyc (``docs/development.md``: what that rules out).

On kvgate's lean server the attempt runs in the request's own task and the server's disconnect callback
(``kvgate_core.asgi.disconnect_watch``) cancels it: no extra task per request. Elsewhere (uvicorn, or a
``receive`` wrapped by a middleware) ``send`` does not fail after the client left, so the only signal is
``http.disconnect`` on ``receive``; a watcher task waits for it while the attempt runs in its own task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from kvgate_core.asgi import DisconnectWatch, Receive, disconnect_watch
from kvgate_core.tasks import current_task

T = TypeVar("T")


async def cancel_on_disconnect(work: Coroutine[Any, Any, T], receive: Receive) -> T | None:
    """Await ``work``; return None if the client disconnected first (``work`` is then cancelled).

    Exceptions of ``work`` propagate unchanged.
    """
    watch = disconnect_watch(receive)
    if watch is None:
        return await _with_watcher_task(work, receive)
    return await _with_callback(work, watch)


async def _with_callback(work: Coroutine[Any, Any, T], watch: DisconnectWatch) -> T | None:
    """``work`` in this task, cancelled by the server's disconnect callback."""
    task = current_task()
    assert task is not None, "called from a task"
    left = False

    def cancel() -> None:
        nonlocal left
        left = True
        task.cancel()

    if not watch(cancel):
        work.close()
        return None
    try:
        return await work
    except asyncio.CancelledError:
        # only this cancellation is swallowed: one from elsewhere (shutdown) leaves a count behind
        if left and task.uncancel() == 0:
            return None
        raise
    finally:
        watch(None)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _with_watcher_task(work: Coroutine[Any, Any, T], receive: Receive) -> T | None:
    """``work`` in a task of its own, cancelled by a watcher task that reads ``http.disconnect``."""
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

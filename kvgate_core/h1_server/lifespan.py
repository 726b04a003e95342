"""The ASGI lifespan protocol: start-up before the server accepts, shut-down after it drained."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kvgate_core.asgi import ASGIApp, Message

logger = logging.getLogger(__name__)


class LifespanFailedError(RuntimeError):
    """The app's start-up failed (``lifespan.startup.failed`` or an exception)."""


class Lifespan:
    """Runs the app's ``lifespan`` scope in a task; ``state`` is what the app stored for requests."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._started: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Send ``lifespan.startup`` and wait for the app's answer.

        Raises:
            LifespanFailedError: the app reported failure or raised.
        """
        loop = asyncio.get_running_loop()
        self._started, self._stopped = loop.create_future(), loop.create_future()
        self._task = loop.create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        await self._started

    async def shutdown(self) -> None:
        """Send ``lifespan.shutdown`` and wait for the app to finish (failures are logged)."""
        if self._task is None or self._stopped is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        try:
            await self._stopped
        except LifespanFailedError as exc:
            logger.error("application shutdown failed: %s", exc)
        await asyncio.wait((self._task,))

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self._app(scope, self._inbox.get, self._send)
        except BaseException as exc:
            logger.exception("application lifespan failed")
            started, stopped = self._started, self._stopped
            fut = started if started is not None and not started.done() else stopped
            if fut is not None and not fut.done():
                fut.set_exception(LifespanFailedError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        else:
            for fut in (self._started, self._stopped):
                if fut is not None and not fut.done():
                    fut.set_result(None)

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        fut = self._started if kind.startswith("lifespan.startup") else self._stopped
        if fut is None or fut.done():
            return
        if kind.endswith(".failed"):
            fut.set_exception(LifespanFailedError(message.get("message", "")))
        else:
            fut.set_result(None)

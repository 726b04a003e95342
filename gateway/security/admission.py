"""A global concurrency cap with a bounded FIFO queue and a queue timeout, as an ASGI middleware.

Only the routes that reach workers (``gateway.openai.routes.WORKER_PATHS``) are admitted through it. Past
``max_concurrent`` requests wait in a queue of at most ``max_queue``; a full queue or a wait over
``queue_timeout_s`` is answered 503 ``overloaded`` with ``Retry-After: 1``. A slot is released when the
response is complete (streams included), also when the client disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass

from gateway.errors import Overloaded
from gateway.openai.routes import WORKER_PATHS
from kvgate_core.asgi import ASGIApp, Receive, Scope, Send

_ADMITTED = WORKER_PATHS


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_concurrent: int
    max_queue: int = 0
    queue_timeout_s: float = 30.0


class Admission:
    """Counts slots; ``acquire`` returns False when the request must be turned away."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> bool:
        if self.active < self.limits.max_concurrent and not self._waiters:
            self.active += 1
            return True
        if len(self._waiters) >= self.limits.max_queue:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(self.limits.queue_timeout_s):
                await fut
        except TimeoutError:
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)
            return False
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise
        return True

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # hand the slot over: ``active`` stays the same
                return
        self.active -= 1


class AdmissionMiddleware:
    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in _ADMITTED:
            await self.app(scope, receive, send)
            return
        if not await self.admission.acquire():
            raise Overloaded("The gateway is at its concurrency limit; retry shortly.", retry_after_s=1)
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.release()

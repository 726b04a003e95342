"""``WatchedResponse``: a plain ASGI response whose writer is cancelled when the client disconnects.

The generation routes (chat, completions, responses) subclass it: ``write`` sends the body, ``close``
always runs afterwards (it aborts the engine streams a response still holds). Also the byte-level helpers
those responses share (headers, sending a whole JSON body).
"""

from __future__ import annotations

import asyncio
from typing import Final

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
JSON_HEADERS: Final = [(b"content-type", b"application/json")]


class WatchedResponse(Response):
    """Runs ``write``; if the client leaves first, cancels it quietly. ``close`` runs in every case."""

    def __init__(self) -> None:
        self.background = None

    async def write(self, send: Send) -> None:
        """Send the whole response (start and body messages)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the response holds (called once ``write`` ended, however it ended)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None, "ASGI apps run in a task"
        watcher = asyncio.create_task(_cancel_on_disconnect(receive, task))
        try:
            await self.write(send)
        except asyncio.CancelledError:
            if not (watcher.done() and not watcher.cancelled()):
                raise
            task.uncancel()  # the client left: nothing to answer
        finally:
            watcher.cancel()
            await self.close()


async def send_whole(send: Send, status: int, body: bytes) -> None:
    """Send a complete JSON response."""
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[object]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    task.cancel()

"""The outermost security layer: a ``KvgateError`` raised by an inner layer becomes OpenAI's error reply.

The security middlewares (auth, rate limits, admission) raise ``gateway.errors`` exceptions instead of
writing replies; this layer renders them with ``gateway.errors.send_error``, the gateway's one renderer.
An error raised after the response has started cannot be answered any more: it propagates to the server,
which closes the connection.
"""

from __future__ import annotations

from gateway.errors import KvgateError, send_error
from kvgate_core.asgi import ASGIApp, Message, Receive, Scope, Send


class ErrorLayer:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except KvgateError as exc:
            if started:
                raise
            await send_error(send, exc)

"""The gateway's lean HTTP/1.1 ASGI server: lifespan, listening sockets, signals, graceful shutdown.

Use ``H1Server(app).run(...)`` from a process's main thread, or ``await H1Server(app).serve(...)`` inside a
running loop (tests); ``request_stop`` starts the graceful shutdown either way.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable, Sequence

from kvgate_core.asgi import ASGIApp
from kvgate_core.h1_server.context import ServerContext, ServerLimits
from kvgate_core.h1_server.lifespan import Lifespan, LifespanFailedError
from kvgate_core.h1_server.protocol import HttpProtocol

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class H1Server:
    """Serve ``app`` until stopped: a first SIGINT/SIGTERM drains for ``grace_s``, a second one cuts short."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        grace_s: float = 30.0,
        limits: ServerLimits | None = None,
        backlog: int = 4096,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        self.started = False
        self._ctx = ServerContext(app, limits or ServerLimits())
        self._grace_s = grace_s
        self._backlog = backlog
        self._on_started = on_started
        self._stop: asyncio.Event | None = None
        self._force: asyncio.Event | None = None
        self.ports: list[int] = []
        self.stopped_by: int | None = None  # the signal that began the shutdown, if one did

    def run(self, host: str, port: int, sockets: Sequence[socket.socket] | None = None) -> None:
        """Serve on a uvloop event loop until a signal stops the server (blocking)."""
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self.serve(host, port, sockets, handle_signals=True))

    def _on_signal(self, sig: int) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        self.request_stop()

    def request_stop(self) -> None:
        """Begin the graceful shutdown (a second call skips the rest of the grace period)."""
        if self._stop is None or self._force is None:
            return
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    async def serve(
        self,
        host: str,
        port: int,
        sockets: Sequence[socket.socket] | None = None,
        *,
        handle_signals: bool = False,
    ) -> None:
        """Start the app, listen (on ``sockets`` when given, e.g. shared SO_REUSEPORT ones), serve until
        ``request_stop``, drain, stop the app. Returns without serving when the app's start-up fails."""
        loop = asyncio.get_running_loop()
        self._stop, self._force = asyncio.Event(), asyncio.Event()
        previous = {sig: signal.getsignal(sig) for sig in _SIGNALS} if handle_signals else {}
        if handle_signals:
            for sig in _SIGNALS:
                loop.add_signal_handler(sig, self._on_signal, sig)
        lifespan = Lifespan(self._ctx.app)
        try:
            await lifespan.startup()
        except LifespanFailedError as exc:
            logger.error("application startup failed: %s", exc)
            return
        self._ctx.lifespan_state = lifespan.state
        self._ctx.date.start(loop)
        servers = await self._listen(loop, host, port, sockets)
        self.started = True
        logger.info("serving HTTP on %s", ", ".join(f"{host}:{p}" for p in self.ports))
        if self._on_started is not None:
            self._on_started()
        try:
            await self._stop.wait()
        finally:
            await self._drain(servers)
            self._ctx.date.stop()
            await lifespan.shutdown()
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(
                    sig, handler
                )  # the caller's own handlers again (asyncio would leave the default)

    async def _listen(
        self, loop: asyncio.AbstractEventLoop, host: str, port: int, sockets: Sequence[socket.socket] | None
    ) -> list[asyncio.Server]:
        ctx = self._ctx

        def factory() -> HttpProtocol:
            return HttpProtocol(ctx, loop)

        if sockets:
            servers = [await loop.create_server(factory, sock=s, backlog=self._backlog) for s in sockets]
        else:
            server = await loop.create_server(factory, host, port, backlog=self._backlog, reuse_address=True)
            servers = [server]
        self.ports = [s.getsockname()[1] for srv in servers for s in srv.sockets]
        return servers

    async def _drain(self, servers: list[asyncio.Server]) -> None:
        """Stop accepting; close idle connections; give in-flight ones the grace period, then cut them."""
        ctx = self._ctx
        ctx.shutting_down = True
        for server in servers:
            server.close()
        for conn in list(ctx.connections):
            conn.shutdown()
        assert self._force is not None
        force = asyncio.ensure_future(self._force.wait())
        try:
            async with asyncio.timeout(self._grace_s):
                while (ctx.connections or ctx.tasks) and not force.done():
                    await asyncio.wait((force,), timeout=0.05)
        except TimeoutError:
            logger.warning("shutdown grace of %.1f s over: closing %d connection(s)", self._grace_s,
                           len(ctx.connections))  # fmt: skip
        finally:
            force.cancel()
        tasks = list(ctx.tasks)
        for conn in list(ctx.connections):
            conn.transport.abort()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for server in servers:
            await server.wait_closed()

"""The proxy's keep-alive HTTP/1.1 client to workers, with a connection cap per worker.
Compiled with mypyc (``docs/development.md``: what that rules out).

Why not aiohttp or httpx here: per proxied request their client machinery costs more CPU than the rest of
the gateway together (``loadtest/bench_proxy.py`` measures it). This client does only what the proxy needs:
one write per request (head and body together), response parsing in C (httptools, chunked decoding
included; ``kvgate_core.h1_connection``), pooled connections per worker, and back-pressure for streams. The
health checker's frequent small GETs (``H1Getter``) and the PD prefill calls (``H1Pool.fetch``) use it too;
other control-plane calls keep httpx.

The pool bounds what one burst can do to a worker: at most ``max_connections`` open connections per host
(a worker sized for N concurrent requests gets at most N), a bounded first-come-first-served wait for a
connection above that, and connects paced to a few in flight per host. Without the cap, thousands of
requests arriving at once open thousands of connections, overflow the worker's listen backlog and fail
after the connect deadline; with it they wait for a keep-alive connection, or are refused at once
(``PoolSaturatedError``, nothing sent) when the wait queue is full too.

It takes from a worker exactly what each response's framing says (``kvgate_core.h1_connection``): a
connection that carried anything after a response, or whose response ended at its close, is closed at once
and dropped on ``release``, never handed to another request.

Failures surface as ``UpstreamConnectionError`` (an ``OSError``). A request that fails on a *reused* idle
connection before any response byte is retried once on a fresh connection, because the worker may have
closed it while idle (the keep-alive race); that retry never reaches the failover logic.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from kvgate_core.h1_connection import H1Connection, Target
from kvgate_core.h1_errors import PoolSaturatedError, PoolWaitTimeoutError, UpstreamConnectionError

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "H1Connection",
    "H1Getter",
    "H1Pool",
    "PoolSaturatedError",
    "PoolWaitTimeoutError",
    "Target",
    "UpstreamConnectionError",
]

#: open connections per host when the caller names no cap
DEFAULT_MAX_CONNECTIONS: Final = 256
#: requests allowed to wait per host beyond the cap's headroom
DEFAULT_MAX_WAITING: Final = 1024
DEFAULT_MAX_WAIT_S: Final = 30.0
#: connects in flight per host
DEFAULT_MAX_CONNECTING: Final = 16
#: a connect deadline timer this late means the event loop was stalled; it waits again, this often at most
_STALL_S: Final = 0.1
_MAX_EXTENSIONS: Final = 3


@dataclass(slots=True, eq=False)
class _Host:
    """One worker's connections: its cap, the idle ones, the requests waiting for one, the connects in flight.

    ``open`` counts every connection held against the cap: in use, idle, and being connected. A waiter's
    future resolves to a connection handed over by ``release`` (reuse it), or to None: a connect slot was
    granted (``open`` and ``connecting`` already count it). Invariant: while requests wait, none is idle.
    """

    name: str
    limit: int
    idle: list[H1Connection] = field(default_factory=list)
    waiters: collections.deque[asyncio.Future[H1Connection | None]] = field(default_factory=collections.deque)
    open: int = 0
    connecting: int = 0


class H1Pool:
    """Keep-alive connections per ``host:port``, at most ``max_connections`` open per host (in use + idle).

    A request that finds the cap reached waits, first come first served, for a connection another request
    releases; at most ``max_connecting`` connects per host are in flight at once (a burst reuses the
    connections its first requests opened instead of stampeding the worker's listen backlog). Per host at
    most ``max_waiting`` requests wait beyond those a connection still allowed under the cap will serve;
    more raise ``PoolSaturatedError`` at once, and a wait longer than ``max_wait_s`` raises
    ``PoolWaitTimeoutError``. Nothing was written to the worker in either case. A waiter that is cancelled
    (its caller's deadline, a client gone) leaves the queue, and a connection handed to it meanwhile goes to
    the next one.

    Args:
        connect_timeout_s: deadline of one TCP (and TLS) connect.
        max_connections: the cap per host when a call names none (``post(limit=…)``).
        max_waiting: requests allowed to wait per host beyond the cap's headroom.
        max_wait_s: the longest wait for a connection.
        max_connecting: connects in flight per host.
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_waiting: int = DEFAULT_MAX_WAITING,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        max_connecting: int = DEFAULT_MAX_CONNECTING,
    ) -> None:
        if min(max_connections, max_connecting) < 1 or max_waiting < 0 or max_wait_s <= 0:
            raise ValueError("max_connections and max_connecting >= 1, max_waiting >= 0, max_wait_s > 0")
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._max_waiting = max_waiting
        self._max_wait_s = max_wait_s
        self._max_connecting = max_connecting
        self._hosts: dict[tuple[str, int, bool], _Host] = {}
        self._closed = False
        #: requests waiting for a connection, all hosts together
        self.num_waiting = 0

    def waiting(self, target: Target) -> int:
        """Requests waiting for a connection to ``target``'s host."""
        host = self._hosts.get(target.key)
        return len(host.waiters) if host is not None else 0

    def open_connections(self, target: Target) -> int:
        """Connections to ``target``'s host held against its cap (in use, idle, connecting)."""
        host = self._hosts.get(target.key)
        return host.open if host is not None else 0

    async def post(self, target: Target, request: bytes, limit: int | None = None) -> H1Connection:
        """Send a complete request (a POST, or any other built by ``Target``); return the connection once the
        response headers arrived.

        ``limit``: the host's cap on open connections (default: the pool's ``max_connections``). The caller
        reads the body from the connection, then calls ``release``.

        Raises:
            PoolSaturatedError: the cap is reached and too many requests wait already (nothing was sent).
            PoolWaitTimeoutError: no connection came free within ``max_wait_s`` (nothing was sent).
            UpstreamConnectionError: connecting or the exchange failed before the response headers.
        """
        host = self._hosts.get(target.key)
        if host is None:
            host = self._hosts[target.key] = _Host(f"{target.host}:{target.port}", self._max_connections)
        if limit is not None and limit != host.limit:
            host.limit = max(1, limit)
            self._dispatch(host)
        idle = host.idle
        while True:
            if idle:
                conn, reused = idle.pop(), True
            else:
                conn, reused = await self._open_or_wait(host, target)
            if conn.closed:
                self._discard(host, conn)
                if reused:  # the worker closed it while idle
                    continue
                raise UpstreamConnectionError(f"{host.name} closed the connection at once")
            try:
                await conn.start(request)
                return conn
            except UpstreamConnectionError:
                self._discard(host, conn)
                if conn.got_bytes or not reused:
                    raise
                # the worker closed it while idle (the keep-alive race): try another one
            except BaseException:  # cancelled (a deadline, a client gone): the connection is mid-exchange
                self._discard(host, conn)
                raise

    async def fetch(self, target: Target, request: bytes, limit: int | None = None) -> tuple[int, bytes]:
        """Send a complete request and read its whole response: ``(status, body)``.

        The connection goes back to the pool only when the response was read to its end; on an error or a
        cancellation (the caller's deadline) it is closed. The caller owns the deadline.

        Raises:
            UpstreamConnectionError: connecting or the exchange failed (``PoolSaturatedError`` among them).
        """
        conn = await self.post(target, request, limit)
        try:
            return conn.status, await conn.read_all()
        finally:
            self.release(target, conn)

    def release(self, target: Target, conn: H1Connection) -> None:
        """Return a connection after use: handed to the first waiter or kept idle when its response
        completed, else closed."""
        host = self._hosts.get(target.key)
        if host is None:  # not this pool's
            conn.abort()
            return
        if not conn.complete or conn.closed or self._closed or host.open > host.limit:
            self._discard(host, conn)
        else:
            self._hand_over(host, conn)

    @staticmethod
    def _hand_over(host: _Host, conn: H1Connection) -> None:
        """A reusable connection goes to the first waiter, else to the idle list."""
        waiters = host.waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(conn)
                return
        host.idle.append(conn)

    def close(self) -> None:
        """Close the idle connections (the ones in use close on release) and fail every waiter."""
        self._closed = True
        for host in self._hosts.values():
            for conn in host.idle:
                conn.abort()
            host.open -= len(host.idle)
            host.idle.clear()
            while host.waiters:
                fut = host.waiters.popleft()
                if not fut.done():
                    fut.set_exception(UpstreamConnectionError("the connection pool is closed"))

    async def _open_or_wait(self, host: _Host, target: Target) -> tuple[H1Connection, bool]:
        """A new connection when the cap and the pacing allow and nobody waits ahead, else one handed over
        (``reused`` True) or connected once a slot is granted."""
        if not host.waiters and host.open < host.limit and host.connecting < self._max_connecting:
            host.open += 1
            host.connecting += 1
            return await self._connect(host, target), False
        conn = await self._wait(host)
        if conn is not None:
            return conn, True
        return await self._connect(host, target), False

    async def _wait(self, host: _Host) -> H1Connection | None:
        if self._closed:
            raise UpstreamConnectionError("the connection pool is closed")
        # waiters a connection still allowed under the cap will serve do not count against max_waiting
        if len(host.waiters) >= self._max_waiting + max(0, host.limit - host.open):
            raise PoolSaturatedError(
                f"{host.name}: {host.open} connections open (cap {host.limit}), {len(host.waiters)} waiting"
            )
        fut: asyncio.Future[H1Connection | None] = asyncio.get_running_loop().create_future()
        host.waiters.append(fut)
        self.num_waiting += 1
        try:
            async with asyncio.timeout(self._max_wait_s):
                return await fut
        except BaseException as exc:
            self._leave(host, fut)
            if isinstance(exc, TimeoutError):
                raise PoolWaitTimeoutError(
                    f"{host.name}: no connection came free in {self._max_wait_s:g} s (cap {host.limit})"
                ) from None
            raise
        finally:
            self.num_waiting -= 1

    def _leave(self, host: _Host, fut: asyncio.Future[H1Connection | None]) -> None:
        """A waiter gave up: take it out of the queue, or pass on what was handed to it meanwhile."""
        if not fut.done() or fut.cancelled():
            fut.cancel()
            with contextlib.suppress(ValueError):
                host.waiters.remove(fut)
            return
        if fut.exception() is not None:
            return
        conn = fut.result()
        if conn is None:  # a connect slot: give it back
            host.open -= 1
            host.connecting -= 1
            self._dispatch(host)
        else:
            self._hand_over(host, conn)

    def _dispatch(self, host: _Host) -> None:
        """Grant connect slots to waiters, first come first served, while the cap and the pacing allow."""
        waiters = host.waiters
        while waiters and host.open < host.limit and host.connecting < self._max_connecting:
            fut = waiters.popleft()
            if not fut.done():
                host.open += 1
                host.connecting += 1
                fut.set_result(None)

    def _discard(self, host: _Host, conn: H1Connection) -> None:
        conn.abort()
        host.open -= 1
        if host.waiters:
            self._dispatch(host)

    async def _connect(self, host: _Host, target: Target) -> H1Connection:
        """Connect within a slot already counted in ``host.open`` and ``host.connecting``."""
        name = host.name
        try:
            conn = await _open(target, self._connect_timeout_s)
        except BaseException as exc:
            host.open -= 1
            if isinstance(exc, TimeoutError):
                raise UpstreamConnectionError(f"connect to {name} timed out") from None
            if isinstance(exc, OSError):
                raise UpstreamConnectionError(f"connect to {name} failed: {exc}") from None
            raise
        finally:
            host.connecting -= 1
            if host.waiters:
                self._dispatch(host)
        return conn


async def _open(target: Target, timeout_s: float) -> H1Connection:
    """Connect to ``target`` within ``timeout_s`` of loop time, not counting the time the loop was stalled.

    A burst of thousands of requests can keep the event loop busy for seconds per iteration; a connect that
    completed meanwhile is seen only after its deadline timer fired, and failing it would turn the burst
    into 502s. So a deadline timer that fires late by more than ``_STALL_S`` (the loop was busy, not the
    worker slow) waits again as long as it was late (at most ``timeout_s``), up to ``_MAX_EXTENSIONS``
    times.

    Raises:
        TimeoutError: the connect did not complete in time.
        OSError: it failed.
    """
    loop = asyncio.get_running_loop()
    factory: Callable[[], H1Connection] = lambda: H1Connection(loop)  # noqa: E731
    task = loop.create_task(loop.create_connection(factory, target.host, target.port, ssl=target.tls or None))
    deadline = loop.time() + timeout_s
    try:
        for _ in range(_MAX_EXTENSIONS + 1):
            await asyncio.wait((task,), timeout=deadline - loop.time())
            if task.done():
                return task.result()[1]
            now = loop.time()
            late = now - deadline
            if late < _STALL_S:
                break
            deadline = now + min(late, timeout_s)
        raise TimeoutError
    finally:
        if not task.done():
            task.cancel()  # create_connection closes its socket


class H1Getter:
    """``await get(base_url, path)`` -> (status, body): small GETs over a keep-alive pool (health probes)."""

    def __init__(self, pool: H1Pool) -> None:
        self._pool = pool

    async def __call__(self, base_url: str, path: str) -> tuple[int, bytes]:
        """Raises ``UpstreamConnectionError`` (an ``OSError``) when the exchange fails."""
        target = Target.parse(base_url)
        return await self._pool.fetch(target, target.get_request(path.encode()))

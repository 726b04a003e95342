"""The upstream client for the request path: one ``H1Pool`` of keep-alive connections to every worker.

Not aiohttp or httpx: their per-request client machinery dominated the gateway's CPU per request (see
``kvgate_core.h1`` and ``loadtest/bench_proxy.py``). The pool caps the open connections per worker (the
proxy passes each worker's cap: ``--upstream-max-connections``, else the worker's advertised running slots)
and queues the requests above it, bounded (``--upstream-max-waiting``, ``--upstream-queue-timeout-s``).
``UpstreamQueue`` (``gateway.proxy.upstream_queue``) shows the routing snapshot those waiting requests.
The health probes get a pool of their own (``open_upstream`` again, wrapped in ``H1Getter``); other
control-plane calls (tokenizer, parity, KV events) use the separate httpx client in ``Deps``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.proxy.upstream_queue import UpstreamQueue
from gateway.settings import Timeouts, UpstreamLimits
from kvgate_core.h1 import H1Pool

__all__ = ["UpstreamQueue", "open_upstream"]


@asynccontextmanager
async def open_upstream(*, timeouts: Timeouts, limits: UpstreamLimits | None = None) -> AsyncIterator[H1Pool]:
    """The proxy's connection pool; every connection is closed on exit.

    The connect deadline and the wait for a connection (at most half the first-byte deadline) live in the
    pool; time-to-first-byte and idle deadlines are per request.
    """
    limits = limits or UpstreamLimits()
    pool = H1Pool(
        connect_timeout_s=timeouts.connect_s,
        max_connections=limits.cap(0),
        max_waiting=limits.max_waiting,
        max_wait_s=limits.wait_s(timeouts.ttfb_s),
        max_connecting=limits.max_connecting,
    )
    try:
        yield pool
    finally:
        pool.close()

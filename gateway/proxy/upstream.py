"""The upstream client for the request path: one ``H1Pool`` of keep-alive connections to every worker.

Not aiohttp or httpx: their per-request client machinery dominated the gateway's CPU per request (see
``kvgate_core.h1`` and ``loadtest/bench_proxy.py``). The pool is unbounded in connections (thousands
of concurrent streams each hold one) and keeps up to 1024 idle ones per worker. The health probes get a
pool of their own (``open_upstream`` again, wrapped in ``H1Getter``); other control-plane calls (tokenizer,
parity, KV events) use the separate httpx client in ``Deps``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.settings import Timeouts
from kvgate_core.h1 import H1Pool


@asynccontextmanager
async def open_upstream(*, timeouts: Timeouts) -> AsyncIterator[H1Pool]:
    """The proxy's connection pool; every connection is closed on exit.

    Only the connect deadline lives in the pool; time-to-first-byte and idle deadlines are per request.
    """
    pool = H1Pool(connect_timeout_s=timeouts.connect_s)
    try:
        yield pool
    finally:
        pool.close()

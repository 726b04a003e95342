"""The upstream HTTP client for the request path: one pooled aiohttp session for every worker.

aiohttp rather than httpx on the hot path: httpx's default transport costs several times more CPU per
request (see PERFORMANCE.md and ``loadtest/bench_proxy.py``). The pool is sized for thousands of
concurrent streams; connections are kept alive between requests. Control-plane calls (health, models,
tokenizer, KV events) use the separate httpx client in ``Deps``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from gateway.settings import Timeouts


@asynccontextmanager
async def open_upstream(*, pool_size: int, timeouts: Timeouts) -> AsyncIterator[aiohttp.ClientSession]:
    """A keep-alive session whose pool holds up to ``pool_size`` connections (all workers together).

    Only the connect deadline is set here; time-to-first-byte and idle deadlines are per request.
    """
    connector = aiohttp.TCPConnector(
        limit=pool_size,
        limit_per_host=0,
        keepalive_timeout=60.0,
        ttl_dns_cache=300,
        enable_cleanup_closed=False,
    )
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, connect=None),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        raise_for_status=False,
    )
    try:
        yield session
    finally:
        await session.close()

"""Run the gateway app in-process on a loopback port (uvicorn in the test's event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import uvicorn

from gateway.app import create_app
from gateway.deps import DepsOverrides
from gateway.settings import Settings, Timeouts, parse_worker
from tests.support.procs import free_port


def settings_for(*urls: str, **overrides: Any) -> Settings:
    base = Settings(
        port=free_port(),
        workers=tuple(parse_worker(u) for u in urls),
        policy="round_robin",
        tokenizer="none",
        timeouts=Timeouts(connect_s=1.0, ttfb_s=2.0, idle_s=0.5),
        health_interval_s=0.2,
    )
    return replace(base, **overrides)


@asynccontextmanager
async def serving(settings: Settings, overrides: DepsOverrides | None = None) -> AsyncIterator[str]:
    """Serve the gateway until the context ends; yields its base URL."""
    app = create_app(settings, overrides)
    config = uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("gateway exited during startup")
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{settings.port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def until(pred: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Poll an async predicate until it holds; TimeoutError after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while not await pred():  # noqa: ASYNC110 - the deadline-bounded poll helper itself
            await asyncio.sleep(0.02)

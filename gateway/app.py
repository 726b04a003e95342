"""``create_app(settings, deps=None)``: the gateway's ASGI application.

The routes are ``gateway.api.application``'s (FastAPI for the control plane, raw ASGI for the completion
routes). The lifespan opens ``Deps``, probes the fleet once so the first request finds healthy workers,
and runs the background loops in one ``TaskGroup`` until shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.api.application import GatewayApp, build_gateway_app
from gateway.deps import DepsOverrides, open_deps
from gateway.observability.loop_lag import watch_loop_lag
from gateway.reload import WorkerSource, reload
from gateway.settings import Settings

__all__ = ["GatewayApp", "create_app"]  # GatewayApp: the type create_app returns

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings, deps: DepsOverrides | None = None, reload_source: WorkerSource | None = None
) -> GatewayApp:
    """Build the gateway app; nothing starts until the ASGI lifespan runs.

    Args:
        settings: validated settings.
        deps: parts to inject instead of building them (tests); the rest is built from ``settings``.
        reload_source: re-reads the worker list on SIGHUP (``gateway.reload``); None disables reloads.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_deps(settings, deps) as built:
            app.state.deps = built
            await built.health.round()
            async with asyncio.TaskGroup() as tasks:
                health = tasks.create_task(built.health.run(), name="health-checks")
                lag = tasks.create_task(watch_loop_lag(built.metrics.loop_lag), name="loop-lag")
                if built.pools is not None:
                    pools = tasks.create_task(built.pools.run(), name="role-pools")
                if reload_source is not None:
                    source = reload_source
                    asyncio.get_running_loop().add_signal_handler(
                        signal.SIGHUP, lambda: tasks.create_task(reload(built, source), name="reload")
                    )
                try:
                    yield
                finally:
                    if reload_source is not None:
                        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
                    health.cancel()
                    lag.cancel()
                    if built.pools is not None:
                        pools.cancel()

    return build_gateway_app(lifespan)

"""The upstream HTTP client's errors (``kvgate_core.h1`` re-exports them).

Kept apart from the client because the client is compiled (``kvgate_core.native``) and mypyc compiles no class
that inherits ``OSError``.
"""

from __future__ import annotations


class UpstreamConnectionError(OSError):
    """The connection failed or closed before the response was complete."""


class PoolSaturatedError(UpstreamConnectionError):
    """The host's connection cap is reached and its wait queue is full; nothing was sent."""


class PoolWaitTimeoutError(PoolSaturatedError):
    """No connection to the host came free within the pool's longest wait; nothing was sent."""

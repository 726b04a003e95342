"""What may be retried on another worker, and how long to wait first.

Only failures before the first byte reached the client are retried (refused or reset connection, a 5xx
answer, a time-to-first-byte timeout): after that the client has seen part of a response. A worker whose
upstream connection cap and wait queue are full is not a failure: the request is ``Shed`` from it before
anything was sent, tried at once on another candidate (no backoff, no breaker mark), and answered 503 +
``Retry-After`` when none is left. A wait for a connection that ran out is shed at once (its time is spent).
"""

from __future__ import annotations

import random

from gateway.errors import UpstreamError, UpstreamSaturated
from gateway.settings import RetrySettings
from kvgate_core.h1 import PoolSaturatedError, PoolWaitTimeoutError


class RetryableFailure(Exception):  # noqa: N818 - a control-flow signal, not an error to report
    """An attempt failed before anything was sent to the client."""

    def __init__(self, error: UpstreamError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


class Shed(Exception):  # noqa: N818 - a control-flow signal, not an error to report
    """The worker had no upstream connection to give; nothing was sent to it or to the client.

    ``reason``: ``queue_full`` (try another worker) or ``wait_timeout`` (``final``: answer 503 now).
    """

    def __init__(self, error: UpstreamSaturated, reason: str, *, final: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason
        self.final = final


def shed_from(exc: PoolSaturatedError, worker: str) -> Shed:
    """The ``Shed`` signal for the pool's refusal ``exc`` on ``worker``."""
    if isinstance(exc, PoolWaitTimeoutError):
        error = UpstreamSaturated(f"worker {worker} had no free connection in time ({exc}); retry shortly")
        return Shed(error, "wait_timeout", final=True)
    error = UpstreamSaturated(
        f"worker {worker} is at its connection cap with a full queue ({exc}); retry shortly"
    )
    return Shed(error, "queue_full", final=False)


def backoff_s(attempt: int, retry: RetrySettings, rng: random.Random) -> float:
    """Full-jitter exponential backoff before retry number ``attempt`` (0-based)."""
    ceiling: float = min(retry.backoff_max_s, retry.backoff_base_s * (2**attempt))
    return ceiling * rng.random()

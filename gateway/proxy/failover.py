"""What may be retried on another worker, and how long to wait first.

Only failures before the first byte reached the client are retried (refused or reset connection, a 5xx
answer, a time-to-first-byte timeout): after that the client has seen part of a response.
"""

from __future__ import annotations

import random

from gateway.errors import UpstreamError
from gateway.settings import RetrySettings


class RetryableFailure(Exception):  # noqa: N818 - a control-flow signal, not an error to report
    """An attempt failed before anything was sent to the client."""

    def __init__(self, error: UpstreamError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


def backoff_s(attempt: int, retry: RetrySettings, rng: random.Random) -> float:
    """Full-jitter exponential backoff before retry number ``attempt`` (0-based)."""
    ceiling: float = min(retry.backoff_max_s, retry.backoff_base_s * (2**attempt))
    return ceiling * rng.random()

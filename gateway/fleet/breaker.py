"""Per-worker circuit breaker: closed → open after N consecutive failures → half-open after a pause.
Compiled with mypyc (``docs/development.md``: what that rules out).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Counts consecutive failures of one worker; ``allows()`` says whether to send it traffic.

    In ``open`` the worker gets nothing until ``open_s`` has passed; then it is ``half_open`` and gets
    traffic again: the next success closes the breaker, the next failure opens it for another period.
    """

    __slots__ = ("_clock", "_failures", "_open_s", "_opened_at", "_threshold")

    def __init__(self, *, failures: int, open_s: float, clock: Callable[[], float]) -> None:
        self._threshold = failures
        self._open_s = open_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at >= self._open_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allows(self) -> bool:
        return self._opened_at is None or self._clock() - self._opened_at >= self._open_s

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None

    def record_failure(self) -> None:
        self._failures += 1
        if self._opened_at is not None or self._failures >= self._threshold:
            self._opened_at = self._clock()

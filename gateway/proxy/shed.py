"""Accounting of requests shed before forwarding: a counter per worker, and one log line per interval.

A saturated fleet sheds hundreds of requests a second; one warning each would flood the log and cost the
gateway the CPU it is short of. Each shed is counted (``kvgate_upstream_shed_total``, by worker and reason).
The log says at once that shedding started, then, once per ``interval_s`` while it goes on and once after
it stopped, how many were shed since (one timer per interval, nothing per request). A request shed from one
worker with a full queue is tried on another candidate; the client gets 503 only when none is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gateway.observability.metrics import Metrics

logger = logging.getLogger(__name__)

#: ``call_later(delay_s, callback)``, as the running event loop's
CallLater = Callable[[float, Callable[[], None]], Any]

_HINT = "raise --upstream-max-connections / --upstream-max-waiting or add workers"


def _loop_call_later(delay_s: float, callback: Callable[[], None]) -> Any:
    return asyncio.get_running_loop().call_later(delay_s, callback)


class ShedLog:
    """Counts sheds in ``metrics``; logs the first at once and the rest as one count per ``interval_s``.

    Args:
        metrics: where each shed is counted.
        interval_s: at most one log line per interval.
        call_later: schedules the interval's report (default: the running loop's ``call_later``).
    """

    def __init__(
        self, metrics: Metrics, *, interval_s: float = 10.0, call_later: CallLater | None = None
    ) -> None:
        self._metrics = metrics
        self._interval_s = interval_s
        self._call_later = call_later or _loop_call_later
        self._pending = 0
        self._latest = ("", "")
        self._armed = False

    def record(self, worker: str, reason: str) -> None:
        """One request shed from ``worker`` (``reason``: queue_full | wait_timeout)."""
        self._metrics.upstream_shed(worker, reason)
        if self._armed:
            self._pending += 1
            self._latest = (worker, reason)
            return
        logger.warning(
            "upstream saturated: shedding started (worker %s, %s; queue_full: tried on another worker or "
            "answered 503, wait_timeout: answered 503); %s",
            worker, reason, _HINT,
            extra={"worker": worker, "reason": reason},
        )  # fmt: skip
        self._arm()

    def _arm(self) -> None:
        self._armed = True
        self._call_later(self._interval_s, self._report)

    def _report(self) -> None:
        if not self._pending:
            self._armed = False  # quiet for an interval: the next shed is logged at once
            return
        worker, reason = self._latest
        logger.warning(
            "upstream saturated: %d more request(s) shed in the last %g s (latest: worker %s, %s); %s",
            self._pending, self._interval_s, worker, reason, _HINT,
            extra={"worker": worker, "reason": reason, "shed": self._pending},
        )  # fmt: skip
        self._pending = 0
        self._arm()

"""A picked request's share of its endpoint's accounting, from the pick until its gRPC stream ends.

The same bookkeeping as the HTTP proxy's attempt (``gateway.proxy.forward``): a ``Hold`` on the load board
while the request is in flight, the worker's breaker told how it went, the request metrics, the prefix-hit
feedback and the policy's observer through ``Router.finished`` (with the response's ``cached_tokens`` where
the response phase was seen). When the data plane reports that another endpoint served the request (a
retry down a fallback list), the hold moves there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.engines.affinity import note_cached_tokens
from gateway.epp.endpoints import record_at
from gateway.epp.picker import Pick
from gateway.fleet.registry import Fleet
from gateway.observability.metrics import Metrics
from gateway.openai.sse import TokenUsage
from gateway.routing.hold import Hold
from gateway.routing.router import Routed, Router
from gateway.state.protocols import LoadBoard

logger = logging.getLogger(__name__)


class InFlight:
    """One request's hold and its end, reported once.

    Args:
        pick: what the picker chose.
        router: told how the request ended (``Router.finished``).
        load: the load board the hold is on.
        fleet: to find the endpoint that really served it.
        metrics: request counters and latency.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        pick: Pick,
        *,
        router: Router,
        load: LoadBoard,
        fleet: Fleet,
        metrics: Metrics,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._routed: Routed = pick.routed
        self._route = pick.parsed.route.label
        self._router = router
        self._load = load
        self._fleet = fleet
        self._metrics = metrics
        self._clock = clock
        self._start = clock()
        self._hold = Hold.take(load, pick.routed.record, pick.tokens)
        self._done = False

    @property
    def worker(self) -> str:
        """The worker id the request is accounted on now."""
        return self._routed.record.id

    def served(self, endpoint: str | None) -> None:
        """The data plane says ``endpoint`` served the request; move the hold there when it is another."""
        if endpoint is None or self._done:
            return
        record = record_at(self._fleet, endpoint)
        if record is None or record.id == self._routed.record.id:
            return
        logger.info("served elsewhere than picked", extra={"picked": self.worker, "served": record.id})
        self._hold.end(answered=False)
        self._hold = Hold.take(self._load, record, self._hold.tokens)
        # no prefix prediction was made for that worker: the feedback loop must not count it as a miss
        self._routed = self._routed.moved_to(record)

    def finish(self, status: int | None, usage: TokenUsage | None = None) -> None:
        """The request ended: ``status`` the response status (None: cancelled or never answered),
        ``usage`` the response's usage when it was seen. Only the first call counts."""
        if self._done:
            return
        self._done = True
        self._hold.end(answered=status is not None)
        latency_s = self._clock() - self._start
        record = self._routed.record
        ok = status is not None and status < 400
        if status is not None and status >= 500:
            record.breaker.record_failure()
        elif status is not None:
            record.breaker.record_success()
        cached = usage.cached_tokens if usage is not None else None
        if cached and note_cached_tokens(record.facts, cached):
            logger.info("worker reuses prefixes (it reported cached tokens)", extra={"worker": record.id})
        self._metrics.request(self._route, status if status is not None else 499, record.id, latency_s)
        self._router.finished(
            self._routed, ok=ok, cached_tokens=cached, latency_s=latency_s,
            prompt_tokens=usage.prompt_tokens if usage is not None else None,
        )  # fmt: skip

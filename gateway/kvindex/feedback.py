"""Closed loop on prefix-hit predictions: what the index predicted versus what the worker reported.

For each proxied request the gateway calls ``PrefixFeedback.record(predicted_tokens, best_tokens,
reported_cached_tokens)`` once the response's usage is known:

- ``predicted_tokens``: the prefix hit the index predicted on the chosen worker (``x-kvgate-prefix-hit``);
- ``best_tokens``: the best prediction on any worker (the policy may trade it for load);
- ``reported_cached_tokens``: ``usage.prompt_tokens_details.cached_tokens`` from the worker, ``None``
  when the worker reports none.

Counters and histograms go to the app's Prometheus registry. ``drift`` turns on when, over the last
``window`` requests with a positive prediction and a report, less than ``min_realised_ratio`` of the
predicted tokens materialised: the signature of a tokenizer, chat template or block-size mismatch between
gateway and engine (or of a stale index).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

logger = logging.getLogger(__name__)

_TOKEN_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536, float("inf"))


@dataclass(frozen=True, slots=True)
class FeedbackConfig:
    """Drift detection settings.

    Attributes:
        window: recent requests (with a positive prediction and a report) considered.
        min_samples: no drift verdict before this many of them.
        min_realised_ratio: drift when realised / predicted tokens over the window falls below this.
    """

    window: int = 200
    min_samples: int = 20
    min_realised_ratio: float = 0.5

    def __post_init__(self) -> None:
        if self.window <= 0 or not 0 < self.min_samples <= self.window:
            raise ValueError("need 0 < min_samples <= window")
        if not 0.0 < self.min_realised_ratio <= 1.0:
            raise ValueError("min_realised_ratio must be in (0, 1]")


class PrefixFeedback:
    """Joins predictions with reported cached tokens; exports metrics and a drift flag."""

    def __init__(self, registry: CollectorRegistry, config: FeedbackConfig | None = None) -> None:
        """Create the metrics on ``registry`` (the app's; one ``PrefixFeedback`` per registry)."""
        self.config = config or FeedbackConfig()
        self._window: deque[tuple[int, int]] = deque(maxlen=self.config.window)
        self._sum_predicted = 0
        self._sum_realised = 0
        self.drift = False
        self._predicted = Histogram(
            "kvgate_prefix_predicted_tokens", "Predicted prefix hit on the chosen worker",
            buckets=_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self._best = Histogram(
            "kvgate_prefix_best_tokens", "Best predicted prefix hit on any worker",
            buckets=_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self._reported = Histogram(
            "kvgate_prefix_reported_cached_tokens", "Cached prompt tokens the worker reported",
            buckets=_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self._predicted_total = Counter(
            "kvgate_prefix_checked_tokens",
            "Predicted hit tokens of requests with a report",
            registry=registry,
        )
        self._realised_total = Counter(
            "kvgate_prefix_realised_tokens", "Predicted hit tokens the worker confirmed", registry=registry
        )
        self._unreported_total = Counter(
            "kvgate_prefix_unreported_requests", "Requests whose worker reported no cached_tokens",
            registry=registry,
        )  # fmt: skip
        self._drift_gauge = Gauge(
            "kvgate_prefix_drift", "1 while predictions do not materialise (tokenizer/template/block-size "
            "mismatch suspected)", registry=registry,
        )  # fmt: skip

    @property
    def realised_ratio(self) -> float | None:
        """Realised / predicted tokens over the window; ``None`` before anything was predicted."""
        return self._sum_realised / self._sum_predicted if self._sum_predicted else None

    def record(self, predicted_tokens: int, best_tokens: int, reported_cached_tokens: int | None) -> None:
        """Record one finished request (see the module docstring for the arguments)."""
        self._predicted.observe(predicted_tokens)
        self._best.observe(best_tokens)
        if reported_cached_tokens is None:
            self._unreported_total.inc()
            return
        self._reported.observe(reported_cached_tokens)
        if predicted_tokens <= 0:
            return
        realised = min(predicted_tokens, reported_cached_tokens)
        self._predicted_total.inc(predicted_tokens)
        self._realised_total.inc(realised)
        self._push(predicted_tokens, realised)
        self._update_drift()

    def _push(self, predicted: int, realised: int) -> None:
        if len(self._window) == self._window.maxlen:
            old_predicted, old_realised = self._window[0]
            self._sum_predicted -= old_predicted
            self._sum_realised -= old_realised
        self._window.append((predicted, realised))
        self._sum_predicted += predicted
        self._sum_realised += realised

    def _update_drift(self) -> None:
        ratio = self.realised_ratio
        drift = (
            len(self._window) >= self.config.min_samples
            and ratio is not None
            and ratio < self.config.min_realised_ratio
        )
        if drift and not self.drift:
            logger.warning(
                "prefix-hit predictions are not materialising (%.0f%% realised over %d requests): check that "
                "the gateway's tokenizer, chat template and --block-size match the workers'",
                100 * (ratio or 0.0), len(self._window),
            )  # fmt: skip
        self.drift = drift
        self._drift_gauge.set(1 if drift else 0)

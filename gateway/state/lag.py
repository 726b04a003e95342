"""How late one replica sees another replica's routing: a small fixed-bucket histogram.

Replicas share three things whose delay decides how well they route together: the load board's figures
(``gateway.state.redis``), the routing predictions (``gateway.kvindex.backplane.shared_predictions``) and
the workers' KV events one replica relays for all (``gateway.kvindex.backplane.relay``). Each receiver
measures, per push or batch it takes in, the wall-clock time since the sending replica made (or received)
its *oldest* change, so the figure is an upper bound for the rest of that batch. The recorder only counts;
``gateway.observability`` exposes it as ``kvgate_replica_lag_seconds{kind}``. Across machines the figure
includes their clock skew.
"""

from __future__ import annotations

import bisect
from typing import Final

#: upper bounds in seconds; the sync runs every 10 ms busy and 50 ms idle, so resolution sits below 100 ms
LAG_BUCKETS: Final = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 5.0,
)  # fmt: skip


class LagRecorder:
    """Counts of observed lags per ``LAG_BUCKETS`` bucket (the last slot: above every bound), their sum and
    count. Negative lags (a sender's clock ahead of ours) count as 0."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LAG_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.counts[bisect.bisect_left(LAG_BUCKETS, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations ≤ it)`` per bucket, ending with ``(inf, count)``."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*LAG_BUCKETS, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

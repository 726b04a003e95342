"""Recently routed work per worker: exponentially decayed sums that gateway replicas can simply add up.

A decayed sum ``D(t) = Σ tokens_i · 2^(-(t - t_i) / h)`` is kept as ``S = Σ tokens_i · 2^((t_i - epoch) / h)``
with ``D(t) = S · 2^(-(t - epoch) / h)``: adding is one multiply, and the value at any time follows from
``(S, epoch)`` alone, so a replica publishes its ``S`` and ``epoch`` and every other replica evaluates it at
its own ``now``. Every replica therefore sees the same fleet-wide figure whenever it looks (up to the sync
interval), which a history sampled at each replica's own decisions cannot give. The epoch moves forward every
``rebase_s`` (wall-clock aligned) so ``S`` stays far from float overflow. Times are wall-clock seconds
(``time.time``): replicas on different hosts agree to within their clock skew (1 s of skew is 2% at 30 s).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

DEFAULT_HALF_LIFE_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class RecentConfig:
    """Half-life of the recent routed load, and how often sums are rebased to a new epoch."""

    half_life_s: float = DEFAULT_HALF_LIFE_S
    rebase_s: float = 600.0

    def __post_init__(self) -> None:
        if self.half_life_s <= 0 or self.rebase_s <= 0:
            raise ValueError("half_life_s and rebase_s must be > 0")


def decayed(total: float, epoch: float, now: float, half_life_s: float) -> float:
    """The value at ``now`` of a sum kept relative to ``epoch``."""
    return total * math.exp2(-(now - epoch) / half_life_s)


class RecentSums:
    """This replica's decayed sums per worker: tokens, requests and predicted cached prompt tokens routed
    (event-loop confined)."""

    __slots__ = ("_cached", "_clock", "_config", "_requests", "_tokens", "epoch")

    def __init__(self, config: RecentConfig, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock
        self.epoch = self._epoch_of(clock())
        self._tokens: dict[str, float] = {}
        self._requests: dict[str, float] = {}
        self._cached: dict[str, float] = {}

    @property
    def half_life_s(self) -> float:
        return self._config.half_life_s

    def _epoch_of(self, now: float) -> float:
        return math.floor(now / self._config.rebase_s) * self._config.rebase_s

    def _rebase(self, now: float) -> None:
        epoch = self._epoch_of(now)
        if epoch > self.epoch:
            keep = math.exp2(-(epoch - self.epoch) / self._config.half_life_s)
            for sums in (self._tokens, self._requests, self._cached):
                for w in sums:
                    sums[w] *= keep
            self.epoch = epoch

    def add(self, worker: str, tokens: int, cached_tokens: int = 0) -> None:
        """Count one request of ``tokens`` routed to ``worker`` now, ``cached_tokens`` of them predicted
        cached there."""
        now = self._clock()
        self._rebase(now)
        weight = math.exp2((now - self.epoch) / self._config.half_life_s)
        tokens = max(0, tokens)
        self._tokens[worker] = self._tokens.get(worker, 0.0) + tokens * weight
        self._requests[worker] = self._requests.get(worker, 0.0) + weight
        if cached_tokens > 0:
            self._cached[worker] = self._cached.get(worker, 0.0) + min(cached_tokens, tokens) * weight

    def now(self) -> float:
        """The clock, rebasing first (call before ``items`` when publishing)."""
        now = self._clock()
        self._rebase(now)
        return now

    def items(self) -> Iterator[tuple[str, float, float, float]]:
        """``(worker, tokens sum, requests sum, cached tokens sum)`` relative to ``epoch``."""
        for w, tokens in self._tokens.items():
            yield w, tokens, self._requests.get(w, 0.0), self._cached.get(w, 0.0)

    def value(self, worker: str, now: float) -> tuple[float, float, float]:
        """Decayed (tokens, requests, cached tokens) of ``worker`` at ``now``."""
        keep = decayed(1.0, self.epoch, now, self._config.half_life_s)
        return (
            self._tokens.get(worker, 0.0) * keep,
            self._requests.get(worker, 0.0) * keep,
            self._cached.get(worker, 0.0) * keep,
        )

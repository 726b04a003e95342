"""Recently routed work per worker: exponentially decayed sums that gateway replicas can simply add up.
Compiled with mypyc (``docs/development.md``: what that rules out).

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

from gateway.settings import DEFAULT_HALF_LIFE_S
from policies.placement import Placement


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


#: What each worker's sums count, in order: routed tokens (prompt + completion budget), requests, prompt
#: tokens predicted cached there, new streams placed there and follow-ups sent there (``policies.placement``).
SLOTS: Final = ("tokens", "requests", "cached", "streams", "follow_ups")
_NONE: Final = (0.0,) * len(SLOTS)


class RecentSums:
    """This replica's decayed sums per worker, one per ``SLOTS`` entry (event-loop confined)."""

    __slots__ = ("_clock", "_config", "_next_epoch", "_sums", "epoch")

    def __init__(self, config: RecentConfig, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock
        self.epoch = self._epoch_of(clock())
        self._next_epoch = self.epoch + config.rebase_s
        self._sums: dict[str, list[float]] = {}

    @property
    def half_life_s(self) -> float:
        return self._config.half_life_s

    def _epoch_of(self, now: float) -> float:
        return math.floor(now / self._config.rebase_s) * self._config.rebase_s

    def _rebase(self, now: float) -> None:
        if now < self._next_epoch:  # the common case: a comparison, not a division (called per worker)
            return
        epoch = self._epoch_of(now)
        if epoch > self.epoch:
            keep = math.exp2(-(epoch - self.epoch) / self._config.half_life_s)
            for sums in self._sums.values():
                for i in range(len(sums)):
                    sums[i] *= keep
            self.epoch = epoch
        self._next_epoch = self.epoch + self._config.rebase_s

    def add(
        self, worker: str, tokens: int, cached_tokens: int = 0, placement: Placement = Placement.OTHER
    ) -> None:
        """Count one request of ``tokens`` routed to ``worker`` now, ``cached_tokens`` of them predicted
        cached there, placed as ``placement``."""
        now = self._clock()
        self._rebase(now)
        weight = math.exp2((now - self.epoch) / self._config.half_life_s)
        tokens = max(0, tokens)
        sums = self._sums.get(worker)
        if sums is None:
            sums = self._sums[worker] = [0.0] * len(SLOTS)
        sums[0] += tokens * weight
        sums[1] += weight
        if cached_tokens > 0:
            sums[2] += min(cached_tokens, tokens) * weight
        if placement is Placement.NEW_STREAM:
            sums[3] += weight
        elif placement is Placement.FOLLOW_UP:
            sums[4] += weight

    def now(self) -> float:
        """The clock, rebasing first (call before ``items`` when publishing)."""
        now = self._clock()
        self._rebase(now)
        return now

    def items(self) -> Iterator[tuple[str, tuple[float, ...]]]:
        """``(worker, sums in SLOTS order)`` relative to ``epoch``."""
        for w, sums in self._sums.items():
            yield w, tuple(sums)

    def value(self, worker: str, now: float) -> tuple[float, ...]:
        """Decayed sums of ``worker`` at ``now``, in ``SLOTS`` order."""
        return self.scaled(worker, self.scale(now))

    def scale(self, now: float) -> float:
        """The factor that turns a sum kept relative to ``epoch`` into its value at ``now``."""
        return decayed(1.0, self.epoch, now, self._config.half_life_s)

    def scaled(self, worker: str, scale: float) -> tuple[float, ...]:
        """``worker``'s sums times ``scale`` (``scale(now)``: their value at ``now``), in ``SLOTS`` order."""
        sums = self._sums.get(worker)
        if sums is None:
            return _NONE
        tokens, requests, cached, streams, follow_ups = sums  # SLOTS, spelled out: no generator per call
        return (tokens * scale, requests * scale, cached * scale, streams * scale, follow_ups * scale)

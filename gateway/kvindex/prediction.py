"""Predicted placements: blocks the gateway just routed to a worker, held for a short TTL.

They let a burst of sibling requests land on the same worker before the worker's ``stored`` events arrive.
An event about the same (worker, block) supersedes the prediction. Entries are bounded by ``max_entries``
(the oldest batch is dropped first) as well as by the TTL.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence


class PredictionTable:
    """Block hash -> bitmask of workers predicted to hold it, expiring after ``ttl_s``."""

    __slots__ = ("_by_bit", "_clock", "_mask", "_max_entries", "_num_entries", "_queue", "ttl_s")

    def __init__(self, *, ttl_s: float, clock: Callable[[], float], max_entries: int) -> None:
        if ttl_s <= 0 or max_entries <= 0:
            raise ValueError("ttl_s and max_entries must be positive")
        self.ttl_s = ttl_s
        self._clock = clock
        self._max_entries = max_entries
        self._mask: dict[int, int] = {}
        self._by_bit: dict[int, dict[int, float]] = {}
        self._queue: deque[tuple[float, int, tuple[int, ...]]] = deque()
        self._num_entries = 0

    @property
    def masks(self) -> dict[int, int]:
        """Live hash -> mask mapping; call ``expire`` first for an up-to-date view."""
        return self._mask

    def __len__(self) -> int:
        return self._num_entries

    def record(self, bit: int, hashes: Sequence[int]) -> None:
        """Predict that the worker with ``bit`` holds ``hashes`` until ``now + ttl_s``."""
        expiry = self._clock() + self.ttl_s
        table = self._by_bit.setdefault(bit, {})
        mask = self._mask
        for h in hashes:
            if h not in table:
                self._num_entries += 1
            table[h] = expiry
            mask[h] = mask.get(h, 0) | bit
        self._queue.append((expiry, bit, tuple(hashes)))
        while self._num_entries > self._max_entries and self._queue:
            self._pop_oldest()

    def expire(self) -> None:
        """Drop predictions whose TTL has passed."""
        now = self._clock()
        queue = self._queue
        while queue and queue[0][0] <= now:
            self._pop_oldest()

    def drop(self, bit: int, hashes: Sequence[int]) -> None:
        """Forget the worker's predictions for ``hashes`` (an event now speaks for them)."""
        table = self._by_bit.get(bit)
        if not table:
            return
        for h in hashes:
            if table.pop(h, None) is not None:
                self._clear(h, bit)

    def drop_worker(self, bit: int) -> None:
        """Forget every prediction of one worker."""
        table = self._by_bit.pop(bit, None)
        for h in table or ():
            self._clear(h, bit)

    def _pop_oldest(self) -> None:
        expiry, bit, hashes = self._queue.popleft()
        table = self._by_bit.get(bit)
        if not table:
            return
        for h in hashes:
            if table.get(h) == expiry:
                del table[h]
                self._clear(h, bit)

    def _clear(self, h: int, bit: int) -> None:
        self._num_entries -= 1
        rest = self._mask.get(h, 0) & ~bit
        if rest:
            self._mask[h] = rest
        else:
            self._mask.pop(h, None)

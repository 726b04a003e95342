"""In-process precise KV index: block hash -> GPU holders (a bitmask of workers) and shared-tier presence.

Fed by worker events (``apply``), predictions from routing (``record_routed``) and snapshots. Each worker's
GPU block count is kept as blocks come and go (``worker_blocks`` reads it without a scan). Memory is
bounded by ``max_blocks`` distinct block hashes with LRU eviction, where "use" is a ``stored`` event or a
routing prediction touching the block (lookups do not refresh recency: that would put a Python-level
operation per matched block on the request path). Feeding lives in ``feeds/`` and ``service.py``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gateway.kvindex.index import PrefixHit
from gateway.kvindex.prediction import PredictionTable
from gateway.kvindex.prefix_scan import MaskGetter, leading_run, prefix_hits
from gateway.kvindex.worker_bits import WorkerBits
from kvgate_core.kvcontract.events import EventType, KVEvent, Tier

_TIER_BITS: dict[Tier, int] = {Tier.DRAM: 1, Tier.SSD: 2}


@dataclass(frozen=True, slots=True)
class MemoryIndexConfig:
    """Limits of a ``MemoryKVIndex``.

    Attributes:
        max_blocks: distinct block hashes kept (GPU or tier); the least recently stored go first. About
            120 bytes each (measured with tracemalloc), so the default costs about 240 MB when full.
        prediction_ttl_s: how long a routing prediction counts as a hit before an event confirms it.
        max_predictions: (worker, block) predictions kept at most.
    """

    max_blocks: int = 2_000_000
    prediction_ttl_s: float = 2.0
    max_predictions: int = 200_000

    def __post_init__(self) -> None:
        if self.max_blocks <= 0 or self.max_predictions <= 0 or self.prediction_ttl_s <= 0:
            raise ValueError("max_blocks, max_predictions and prediction_ttl_s must be positive")


class MemoryKVIndex:
    """``KVIndex`` held in this process (the default, and each replica's local copy in Redis mode).

    Lookup cost is linear in the matched length but runs in C (see ``prefix_scan``); updates are O(hashes in
    the event). ``remove_worker`` and ``cleared`` events scan the whole index (rare, O(entries)).
    """

    __slots__ = ("_bits", "_counts", "_gpu", "_on_evict", "_preds", "_tier", "config")

    def __init__(
        self,
        config: MemoryIndexConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[int], None] | None = None,
    ) -> None:
        """Create an empty index.

        Args:
            config: limits; defaults when omitted.
            clock: monotonic seconds, for prediction TTLs.
            on_evict: called with the number of block entries evicted by the memory budget (a metric hook).
        """
        self.config = config or MemoryIndexConfig()
        self._bits = WorkerBits()
        # Insertion order of this OrderedDict is the LRU order of every known block, tier-only ones included.
        self._gpu: OrderedDict[int, int] = OrderedDict()
        self._tier: dict[int, int] = {}
        self._counts: dict[int, int] = {}  # worker bit -> GPU blocks whose mask holds it
        self._preds = PredictionTable(
            ttl_s=self.config.prediction_ttl_s, clock=clock, max_entries=self.config.max_predictions
        )
        self._on_evict = on_evict

    def apply(self, event: KVEvent) -> None:
        """Apply one event; ``stored``/``removed`` are idempotent."""
        if event.type is EventType.CLEARED:
            self._clear(event.worker, event.tier)
        elif event.tier is Tier.GPU:
            bit = self._bits.ensure(event.worker)
            self._preds.drop(bit, event.hashes)
            if event.type is EventType.STORED:
                self._store_gpu(bit, event.hashes)
            else:
                self._remove_gpu(bit, event.hashes)
        elif event.type is EventType.STORED:
            self._store_tier(_TIER_BITS[event.tier], event.hashes)
        else:
            self._remove_tier(_TIER_BITS[event.tier], event.hashes)

    def record_routed(self, worker: str, hashes: Sequence[int]) -> None:
        """Predict that ``worker`` will hold ``hashes`` for ``prediction_ttl_s``.

        The leading blocks its events already place on it need no prediction: a conversation's next turn
        then records its new blocks only, not its whole history again (and their expiry walks only those).
        """
        if not hashes:
            return
        bit = self._bits.ensure(worker)
        held = leading_run(self._gpu, hashes, bit)
        if held < len(hashes):
            self._preds.record(bit, hashes[held:])

    def longest_prefix(self, hashes: Sequence[int], workers: Iterable[str]) -> Mapping[str, PrefixHit]:
        """Per worker: leading blocks on its GPU (events or live predictions), then shared-tier blocks."""
        self._preds.expire()
        getters: list[MaskGetter] = [self._gpu.get]
        predicted = self._preds.masks
        # a C-level membership pass first: most prompts touch no live prediction, and then the scan reads
        # one map instead of OR-ing two
        if predicted and not predicted.keys().isdisjoint(hashes):
            getters.append(predicted.get)
        return prefix_hits(hashes, workers, self._bits.bits, getters, self._tier)

    def remove_worker(self, worker: str) -> None:
        """Forget the worker's GPU blocks and predictions, and free its bit."""
        self._clear(worker, Tier.GPU)
        bit = self._bits.release(worker)
        if bit:
            self._preds.drop_worker(bit)
            self._counts.pop(bit, None)

    def num_blocks(self) -> int:
        """Distinct block hashes held (GPU or tier), excluding predictions."""
        return len(self._gpu)

    def num_predictions(self) -> int:
        """Live (worker, block) predictions."""
        return len(self._preds)

    def blocks_of(self, worker: str) -> int:
        """GPU blocks the index holds for one worker."""
        bit = self._bits.get(worker)
        return self._counts.get(bit, 0) if bit else 0

    def worker_blocks(self) -> dict[str, int]:
        """GPU blocks held per worker that has (or had) any."""
        counts = self._counts
        return {worker: counts.get(bit, 0) for worker, bit in self._bits.bits.items()}

    def _store_gpu(self, bit: int, hashes: Sequence[int]) -> None:
        gpu = self._gpu
        # Newest last, walking the event's chain backwards: a prefix's head is then evicted after its tail,
        # so budget eviction shortens matches instead of punching a hole at their start.
        added = 0
        for h in reversed(hashes):
            mask = gpu.pop(h, 0)
            if not mask & bit:
                added += 1
            gpu[h] = mask | bit
        self._counts[bit] = self._counts.get(bit, 0) + added
        self._evict()

    def _remove_gpu(self, bit: int, hashes: Sequence[int]) -> None:
        gpu = self._gpu
        removed = 0
        for h in hashes:
            mask = gpu.get(h)
            if mask is None or not mask & bit:
                continue
            removed += 1
            mask &= ~bit
            if mask or h in self._tier:
                gpu[h] = mask
            else:
                del gpu[h]
        if removed:
            self._counts[bit] -= removed

    def _store_tier(self, tier_bit: int, hashes: Sequence[int]) -> None:
        gpu, tier = self._gpu, self._tier
        for h in reversed(hashes):
            gpu[h] = gpu.pop(h, 0)
            tier[h] = tier.get(h, 0) | tier_bit
        self._evict()

    def _remove_tier(self, tier_bit: int, hashes: Sequence[int]) -> None:
        for h in hashes:
            rest = self._tier.get(h, 0) & ~tier_bit
            if rest:
                self._tier[h] = rest
                continue
            self._tier.pop(h, None)
            if self._gpu.get(h, 1) == 0:
                del self._gpu[h]

    def _clear(self, worker: str, tier: Tier) -> None:
        if tier is Tier.GPU:
            bit = self._bits.get(worker)
            if bit:
                self._preds.drop_worker(bit)
                stale = [h for h, m in self._gpu.items() if m & bit]
                self._remove_gpu(bit, stale)
            return
        tier_bit = _TIER_BITS[tier]
        self._remove_tier(tier_bit, [h for h, t in self._tier.items() if t & tier_bit])

    def _evict(self) -> None:
        excess = len(self._gpu) - self.config.max_blocks
        if excess <= 0:
            return
        gpu, tier, counts = self._gpu, self._tier, self._counts
        for _ in range(excess):
            h, mask = gpu.popitem(last=False)
            tier.pop(h, None)
            while mask:
                low = mask & -mask
                counts[low] = counts.get(low, 1) - 1
                mask ^= low
        if self._on_evict is not None:
            self._on_evict(excess)

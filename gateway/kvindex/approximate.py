"""Approximate KV index for backends that publish no events (SGLang's router works this way).

It records what the gateway routed to each worker and assumes the worker cached it: per worker at most
``capacity_blocks`` blocks (least recently routed go first, and of one prompt its deepest blocks first, as
an engine frees a request's tail before its prefix) for at most ``ttl_s`` seconds. Events, if any
arrive anyway, are applied too (``removed``/``cleared`` make the guess more accurate). Shared tiers are not
modelled here: approximate mode never claims a ``dram``/``ssd`` hit.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice, repeat

from gateway.kvindex.index import PrefixHit
from gateway.kvindex.prefix_scan import prefix_hits
from gateway.kvindex.worker_bits import WorkerBits
from kvgate_core.kvcontract.events import EventType, KVEvent, Tier


@dataclass(frozen=True, slots=True)
class ApproximateIndexConfig:
    """Assumed cache of each worker.

    Attributes:
        capacity_blocks: blocks a worker is assumed to keep where nothing better is known.
        ttl_s: how long a routed block is assumed to stay cached.
        max_blocks: the memory budget: (worker, block) entries held in all, whatever capacities are set
            (each worker's capacity is capped at an equal share of it). About 100 bytes an entry.
    """

    capacity_blocks: int = 16_384
    ttl_s: float = 300.0
    max_blocks: int = 2_000_000

    def __post_init__(self) -> None:
        if self.capacity_blocks <= 0 or self.ttl_s <= 0 or self.max_blocks <= 0:
            raise ValueError("capacity_blocks, ttl_s and max_blocks must be positive")


class ApproximateKVIndex:
    """``KVIndex`` guessed from routing decisions, bounded per worker by capacity and TTL."""

    __slots__ = ("_bits", "_capacity", "_clock", "_mask", "_recent", "_share", "config")

    def __init__(
        self, config: ApproximateIndexConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or ApproximateIndexConfig()
        self._clock = clock
        self._bits = WorkerBits()
        self._mask: dict[int, int] = {}
        # Per worker: block -> time last routed, oldest first (LRU and TTL order coincide).
        self._recent: dict[str, OrderedDict[int, float]] = {}
        # Per worker: its assumed capacity in blocks where its engine says (else ``config.capacity_blocks``).
        self._capacity: dict[str, int] = {}
        self._share = self.config.max_blocks  # each worker's cap: the budget over the workers known

    def set_capacity(self, worker: str, blocks: int) -> None:
        """Assume ``worker`` keeps ``blocks`` blocks (its engine's KV capacity in the gateway's blocks)."""
        if blocks <= 0:
            raise ValueError("capacity must be positive")
        self._capacity[worker] = blocks
        self._reshare()
        recent = self._recent.get(worker)
        if recent is not None:
            self._trim(self._bits.get(worker), recent, self._clock(), self.capacity(worker))

    def capacity(self, worker: str) -> int:
        """Blocks ``worker`` is assumed to keep: as set (or the default), within its share of the budget."""
        return min(self._capacity.get(worker, self.config.capacity_blocks), self._share)

    def held(self, worker: str) -> int:
        """Blocks assumed cached on ``worker`` now (expired ones included until the next lookup)."""
        recent = self._recent.get(worker)
        return len(recent) if recent is not None else 0

    def apply(self, event: KVEvent) -> None:
        """Apply a GPU event (tiers are ignored in this mode)."""
        if event.tier is not Tier.GPU:
            return
        if event.type is EventType.CLEARED:
            self.forget(event.worker)
        elif event.type is EventType.STORED:
            self.record_routed(event.worker, event.hashes)
        else:
            self._forget(event.worker, event.hashes)

    def record_routed(self, worker: str, hashes: Sequence[int]) -> None:
        """The request was routed to ``worker``: assume it now caches ``hashes``."""
        bit = self._bits.ensure(worker)
        recent = self._recent.get(worker)
        if recent is None:
            recent = self._recent[worker] = OrderedDict()
            self._reshare()
        now = self._clock()
        mask = self._mask
        # a prompt's blocks are mostly routed there before (a conversation's history): only the new ones
        # change the mask. Every one is stamped now and moved to the recent end in C-level loops (~500
        # blocks a prompt), the prompt's first block last: as an engine frees a request's blocks (vLLM
        # queues them tail first), the deepest go first and the prefix that later requests match stays.
        new = [h for h in hashes if h not in recent]
        recent.update(zip(hashes, repeat(now)))
        _drain(map(recent.move_to_end, reversed(hashes)))
        for h in new:
            mask[h] = mask.get(h, 0) | bit
        self._trim(bit, recent, now, self.capacity(worker))

    def longest_prefix(self, hashes: Sequence[int], workers: Iterable[str]) -> Mapping[str, PrefixHit]:
        """Leading blocks per worker among those still assumed cached."""
        now = self._clock()
        for worker, recent in self._recent.items():
            self._trim(self._bits.get(worker), recent, now, self.capacity(worker))
        return prefix_hits(hashes, workers, self._bits.bits, [self._mask.get])

    def remove_worker(self, worker: str) -> None:
        """Forget everything assumed about ``worker`` (it left), its capacity included."""
        self._capacity.pop(worker, None)
        self.forget(worker)

    def forget(self, worker: str) -> None:
        """Forget where ``worker``'s blocks are assumed to be (its capacity stays)."""
        recent = self._recent.pop(worker, None)
        bit = self._bits.release(worker)
        for h in recent or ():
            self._clear(h, bit)
        self._reshare()

    def num_blocks(self) -> int:
        """(worker, block) entries held."""
        return sum(len(r) for r in self._recent.values())

    def worker_blocks(self) -> dict[str, int]:
        """Blocks assumed cached per worker (expired ones included until the next lookup trims them)."""
        return {worker: len(recent) for worker, recent in self._recent.items()}

    def _forget(self, worker: str, hashes: Sequence[int]) -> None:
        recent = self._recent.get(worker)
        if recent is None:
            return
        bit = self._bits.get(worker)
        for h in hashes:
            if recent.pop(h, None) is not None:
                self._clear(h, bit)

    def _reshare(self) -> None:
        known = len(self._capacity.keys() | self._recent.keys())
        share = self.config.max_blocks // max(1, known)
        if share < self._share:  # a smaller share: trim the others down to it now
            now = self._clock()
            for worker, recent in self._recent.items():
                if len(recent) > share:
                    self._trim(self._bits.get(worker), recent, now, share)
        self._share = share

    def _trim(self, bit: int, recent: OrderedDict[int, float], now: float, capacity: int) -> None:
        """Drop the least recently routed blocks past ``capacity``, then those older than the TTL."""
        excess = len(recent) - capacity
        if excess > 0:
            victims = list(islice(recent, excess))
            _drain(map(recent.__delitem__, victims))
            mask, others = self._mask, ~bit
            for h in victims:
                rest = mask.get(h, 0) & others
                if rest:
                    mask[h] = rest
                else:
                    mask.pop(h, None)
        cutoff = now - self.config.ttl_s
        while recent:
            h, seen = next(iter(recent.items()))
            if seen > cutoff:
                break
            del recent[h]
            self._clear(h, bit)

    def _clear(self, h: int, bit: int) -> None:
        rest = self._mask.get(h, 0) & ~bit
        if rest:
            self._mask[h] = rest
        else:
            self._mask.pop(h, None)


def _drain(calls: Iterable[object]) -> None:
    """Run a lazy ``map`` of calls to the end, in C."""
    deque(calls, maxlen=0)

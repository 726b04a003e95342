"""The KV index protocol: block hash -> where that prefix's KV lives, with longest-prefix lookup.

Implementations: ``memory.MemoryKVIndex`` (default), a Redis-fed local copy for gateway replicas, and the
approximate index for backends that publish no events. Lookups are synchronous and in-process so a request
never waits on the network; feeding the index (events, snapshots, Redis streams) happens in background tasks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvgate_core.kvcontract.events import KVEvent


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Leading blocks of a request found for one worker.

    Attributes:
        gpu_blocks: leading blocks held in the worker's own cache.
        tier_blocks: further leading blocks (after ``gpu_blocks``) present in the shared dram/ssd tiers.
    """

    gpu_blocks: int = 0
    tier_blocks: int = 0


class KVIndex(Protocol):
    """Where each block lives.

    Contract: ``apply`` is idempotent for ``stored``/``removed``; ``longest_prefix`` counts leading blocks
    only (a hole ends the match) and returns an entry for every worker asked about (zeros when unknown).
    Methods are not thread safe; call them from the event loop.
    """

    def apply(self, event: KVEvent) -> None:
        """Apply one worker (or tier) event."""
        ...

    def record_routed(self, worker: str, hashes: Sequence[int]) -> None:
        """Record a predicted placement (the request was just routed there); it expires after a short TTL."""
        ...

    def longest_prefix(self, hashes: Sequence[int], workers: Iterable[str]) -> Mapping[str, PrefixHit]:
        """Leading-block hits per worker for a request's block hashes."""
        ...

    def remove_worker(self, worker: str) -> None:
        """Forget every block of a worker (it left or restarted)."""
        ...

    def num_blocks(self) -> int:
        """Block entries held (for metrics and the memory budget)."""
        ...

    def worker_blocks(self) -> Mapping[str, int]:
        """Blocks held per worker (its own cache; predictions excluded), for the admin page. Cheap: no scan
        of the index."""
        ...

"""Counters a KV tier keeps: hits, misses, damaged or foreign values, I/O errors, writes, evictions.

Plain integers on a mutable object owned by one tier; exporting them as Prometheus metrics is the
worker's job (it reads ``TierClient.stats()`` snapshots), so no metrics library is imported here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(slots=True)
class TierStats:
    """Cumulative counters of one tier (or of a layered tier and everything below it).

    Attributes:
        hits: blocks returned by ``get_many``.
        misses: blocks asked for and not returned (absent, damaged, foreign or during an outage).
        corrupt: values that failed the wire checks (truncated, bad magic/version, checksum).
        mismatched: intact values for another model, hash or layout.
        errors: backend operations that failed (Redis down, disk error); each one degrades, never raises.
        stored_blocks: blocks written by ``put_many``.
        stored_bytes: bytes written by ``put_many``.
        read_bytes: bytes of the values returned by ``get_many``.
        evicted: blocks this tier removed to stay within its capacity.
        dropped: blocks a write-behind queue refused because it was full.
        promoted: lower-tier hits copied into a faster tier.
        demoted: blocks moved from a faster tier to a slower one.
    """

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    mismatched: int = 0
    errors: int = 0
    stored_blocks: int = 0
    stored_bytes: int = 0
    read_bytes: int = 0
    evicted: int = 0
    dropped: int = 0
    promoted: int = 0
    demoted: int = 0

    def snapshot(self) -> TierStats:
        """A copy that later updates do not change."""
        return dataclasses.replace(self)

    def plus(self, other: TierStats) -> TierStats:
        """Field-wise sum, as a new object."""
        return TierStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)}
        )

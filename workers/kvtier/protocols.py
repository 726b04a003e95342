"""What a shared KV tier is: an async, batch-first block store where ``None`` means a miss.

``TierClient`` is the read side every tier offers; ``WritableTier`` adds writes. A read-only tier (a
snapshot mounted from elsewhere) implements only ``TierClient``; there are no ``supports_*`` flags.
Implementations: ``RedisTier`` (dram), ``SsdTier`` (ssd), ``LayeredTier`` (dram over ssd). Deciding
*whether* to pull is the planner's job (``planner.py``), not the client's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from workers.kvtier.stats import TierStats


class TierClient(Protocol):
    """Read side of a KV tier bound to one model and block layout.

    Contract:
        - Every method takes block hashes (unsigned 64-bit, kvcontract scheme) and answers per hash, in
          order, for the whole batch in as few round trips as the backend allows.
        - A value is returned only after the wire checks passed (magic, version, both checksums, model,
          hash and, when the tier was given one, the layout). A damaged or foreign value is a miss and is
          counted in ``stats()``; it is never served.
        - Outages (Redis down, disk error) never raise: the batch answers misses, ``is_degraded`` turns
          true and ``stats().errors`` counts it. Only programming errors raise.
        - Methods are safe to call concurrently from tasks of one event loop.
    """

    @property
    def is_degraded(self) -> bool:
        """True while the last backend operation failed (cleared by the next success)."""
        ...

    def stats(self) -> TierStats:
        """A snapshot of the tier's counters."""
        ...

    async def get_many(self, hashes: Sequence[int]) -> list[bytes | None]:
        """The stored wire values (header + payload, ``kvgate_core.kvcontract.wire``); ``None``: a miss."""
        ...

    async def exists_many(self, hashes: Sequence[int]) -> list[bool]:
        """Whether each block is present (not verified: a later ``get_many`` may still miss)."""
        ...

    async def contains_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` are present (0 when the first one is absent)."""
        ...

    async def aclose(self) -> None:
        """Release connections, threads and background tasks. The tier is unusable afterwards."""
        ...


class WritableTier(TierClient, Protocol):
    """A tier that also stores and deletes blocks."""

    async def put_many(self, blocks: Sequence[tuple[int, bytes]]) -> int:
        """Store ``(hash, wire value)`` pairs; return how many were stored (0 during an outage).

        Writing a block that is already present replaces it; concurrent writers of the same block are
        safe (the value of a hash is the same whoever computed it, so either write may win).
        """
        ...

    async def delete_many(self, hashes: Sequence[int]) -> int:
        """Remove blocks; return how many were present."""
        ...


def leading_present(flags: Sequence[bool]) -> int:
    """Length of the run of ``True`` at the start of ``flags``."""
    for i, flag in enumerate(flags):
        if not flag:
            return i
    return len(flags)

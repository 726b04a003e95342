"""Layered tier: DRAM (Redis) over SSD, read-through with promotion, write-behind with a bounded queue.

Reads ask DRAM for the whole batch, then SSD for what DRAM missed; SSD hits are returned at once and
copied into DRAM in the background (promotion). Writes are queued and return immediately: a background
task writes each batch to DRAM and, with ``write_ssd`` (the default), to SSD too. Writing to SSD eagerly
is how blocks are demoted: Redis evicts silently under ``maxmemory``, so the copy must already be on SSD
when that happens. ``demote_many`` moves blocks out of DRAM explicitly (copy to SSD, then delete).

The queue holds at most ``queue_blocks`` blocks. When it is full the trailing blocks of a batch are
dropped and counted (``stats().dropped``); the leading ones are kept, since a prefix is only useful from
its start. The caller is never blocked. ``flush()`` waits for the queue to drain (a prefill worker in a
PD pair calls it before handing the request to the decode worker).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from workers.kvtier.protocols import WritableTier, leading_present
from workers.kvtier.stats import TierStats

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LayeredConfig:
    """Settings of a layered tier.

    Attributes:
        queue_blocks: the most blocks waiting in the write-behind queue.
        write_ssd: write new blocks to SSD as well as DRAM (eager demotion).
        promote: copy SSD hits into DRAM.
    """

    queue_blocks: int = 1024
    write_ssd: bool = True
    promote: bool = True

    def validate(self) -> None:
        if self.queue_blocks <= 0:
            raise ValueError("queue_blocks must be positive")


@dataclass(frozen=True, slots=True)
class _Job:
    blocks: tuple[tuple[int, bytes], ...]
    to_dram: bool
    to_ssd: bool


class LayeredTier:
    """``WritableTier`` over a DRAM and an SSD ``WritableTier``; it owns and closes both."""

    def __init__(self, dram: WritableTier, ssd: WritableTier, config: LayeredConfig | None = None) -> None:
        self._cfg = config or LayeredConfig()
        self._cfg.validate()
        self._dram = dram
        self._ssd = ssd
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._pending_blocks = 0
        self._writer: asyncio.Task[None] | None = None
        self._stats = TierStats()

    @property
    def is_degraded(self) -> bool:
        return self._dram.is_degraded or self._ssd.is_degraded

    @property
    def pending_blocks(self) -> int:
        return self._pending_blocks

    def stats(self) -> TierStats:
        """Own counters (hits, misses, dropped, promoted, demoted) plus the inner tiers' rejections."""
        inner = self._dram.stats().plus(self._ssd.stats())
        out = self._stats.snapshot()
        out.corrupt, out.mismatched, out.errors = inner.corrupt, inner.mismatched, inner.errors
        out.evicted, out.stored_blocks, out.stored_bytes = (
            inner.evicted,
            inner.stored_blocks,
            inner.stored_bytes,
        )
        return out

    async def get_many(self, hashes: Sequence[int]) -> list[bytes | None]:
        out = await self._dram.get_many(hashes)
        missing = [i for i, v in enumerate(out) if v is None]
        if missing:
            lower = await self._ssd.get_many([hashes[i] for i in missing])
            promote: list[tuple[int, bytes]] = []
            for i, value in zip(missing, lower, strict=True):
                if value is not None:
                    out[i] = value
                    promote.append((hashes[i], value))
            if promote and self._cfg.promote:
                self._stats.promoted += self._enqueue(promote, to_dram=True, to_ssd=False)
        hits = sum(v is not None for v in out)
        self._stats.hits += hits
        self._stats.misses += len(out) - hits
        return out

    async def exists_many(self, hashes: Sequence[int]) -> list[bool]:
        found = await self._dram.exists_many(hashes)
        missing = [i for i, ok in enumerate(found) if not ok]
        if missing:
            lower = await self._ssd.exists_many([hashes[i] for i in missing])
            for i, ok in zip(missing, lower, strict=True):
                found[i] = ok
        return found

    async def contains_prefix(self, hashes: Sequence[int]) -> int:
        return leading_present(await self.exists_many(hashes))

    async def put_many(self, blocks: Sequence[tuple[int, bytes]]) -> int:
        """Queue blocks for writing; return how many were accepted (the rest were dropped and counted)."""
        return self._enqueue(blocks, to_dram=True, to_ssd=self._cfg.write_ssd)

    def _enqueue(self, blocks: Sequence[tuple[int, bytes]], *, to_dram: bool, to_ssd: bool) -> int:
        room = max(0, self._cfg.queue_blocks - self._pending_blocks)
        accepted = tuple(blocks[:room])
        self._stats.dropped += len(blocks) - len(accepted)
        if accepted:
            self._pending_blocks += len(accepted)
            self._queue.put_nowait(_Job(accepted, to_dram, to_ssd))
            self._ensure_writer()
        return len(accepted)

    def _ensure_writer(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="kvtier-writer")

    async def _write_loop(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await self._write(job)
            except Exception:  # task boundary: a failed batch must not stop later writes
                logger.exception("write-behind batch of %d blocks failed", len(job.blocks))
            finally:
                self._pending_blocks -= len(job.blocks)
                self._queue.task_done()

    async def _write(self, job: _Job) -> None:
        if job.to_dram:
            await self._dram.put_many(job.blocks)
        if job.to_ssd:
            await self._ssd.put_many(job.blocks)

    async def flush(self) -> None:
        """Wait until every queued block has been written (or failed)."""
        await self._queue.join()

    async def delete_many(self, hashes: Sequence[int]) -> int:
        """Remove blocks from both tiers; return how many were present in either."""
        in_dram = await self._dram.exists_many(hashes)
        in_ssd = await self._ssd.exists_many(hashes)
        await self._dram.delete_many(hashes)
        await self._ssd.delete_many(hashes)
        return sum(a or b for a, b in zip(in_dram, in_ssd, strict=True))

    async def demote_many(self, hashes: Sequence[int]) -> int:
        """Move blocks from DRAM to SSD (copy, then delete from DRAM); return how many moved."""
        values = await self._dram.get_many(hashes)
        blocks = [(h, v) for h, v in zip(hashes, values, strict=True) if v is not None]
        stored = await self._ssd.put_many(blocks)
        if stored != len(blocks):
            return 0  # keep the DRAM copies: the SSD write failed in part
        await self._dram.delete_many([h for h, _ in blocks])
        self._stats.demoted += len(blocks)
        return len(blocks)

    async def aclose(self, *, drain_timeout_s: float = 5.0) -> None:
        """Drain the queue (up to ``drain_timeout_s``), stop the writer and close both tiers."""
        if self._writer is not None:
            try:
                async with asyncio.timeout(drain_timeout_s):
                    await self.flush()
            except TimeoutError:
                logger.warning("closing with %d blocks still queued", self._pending_blocks)
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        await self._dram.aclose()
        await self._ssd.aclose()

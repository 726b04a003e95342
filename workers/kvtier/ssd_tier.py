"""SSD tier: KV blocks as files on local NVMe or a shared file system, with a byte capacity and LRU.

Layout: ``{root}/{model}/{hh}/{hash:016x}.kv`` where ``hh`` is the first two hex digits of the hash and
``model`` is the model id percent-quoted into one path segment (``org/name`` → ``org%2Fname``). A block is
written to a unique temp file in the same directory and renamed over the final name, so readers never see
a partial file and concurrent writers of one block are safe (the last rename wins; both values are equal).

Capacity: an in-memory LRU (hash → file size), rebuilt at ``open`` by scanning the directory in order of
last access (``max(atime, mtime)``); after a write pushes the total over ``capacity_bytes`` the least
recently used files are unlinked. Several processes sharing a directory each enforce the limit over what
they know, so the total may exceed it by one writer's batch; reads also find files other processes wrote.

I/O runs on an owned thread pool: a batch of reads (open, read, verify the checksum) is spread over
``io_threads`` threads; the event loop only gathers the results and updates the index. A damaged file is
a counted miss and is deleted (it will be written again); disk errors are counted and degrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from kvgate_core.kvcontract.wire import BlockLayout
from workers.kvtier.block_check import BlockChecker, Verdict, tally
from workers.kvtier.events import TierEvents
from workers.kvtier.protocols import leading_present
from workers.kvtier.ssd_scan import scan_blocks
from workers.kvtier.stats import TierStats

logger = logging.getLogger(__name__)
T = TypeVar("T")
_Read = tuple[bytes | None, Verdict | None, str]  # value, verdict (None: absent or I/O error), error text


@dataclass(frozen=True, slots=True)
class SsdTierConfig:
    """Settings of an SSD tier.

    Attributes:
        root: the tier directory (shared by models; each model has a subdirectory).
        model: the model id (part of the path, and checked in every value read).
        capacity_bytes: the most bytes of block files this process keeps.
        layout: when given, values of another block layout are misses.
        io_threads: threads for parallel file reads and writes.
        fsync: fsync each file before the rename (survives power loss; slower). Without it a torn file
            after a crash fails its checksum and is a miss.
        log_interval_s: at most one I/O-failure warning per interval.
    """

    root: Path
    model: str
    capacity_bytes: int
    layout: BlockLayout | None = None
    io_threads: int = 8
    fsync: bool = False
    log_interval_s: float = 10.0

    def validate(self) -> None:
        if self.capacity_bytes <= 0 or self.io_threads <= 0:
            raise ValueError("capacity_bytes and io_threads must be positive")
        if model_dir(self.root, self.model).parent != self.root or self.model in ("", ".", ".."):
            raise ValueError(f"model id {self.model!r} cannot name a directory under {self.root}")


def model_dir(root: Path, model: str) -> Path:
    """The directory holding ``model``'s blocks."""
    return root / quote(model, safe="")


def block_path(root: Path, model: str, block_hash: int) -> Path:
    """The file of a block (the tier's file layout: ``{dir}/{model}/{hash[:2]}/{hash}.kv``)."""
    name = f"{block_hash:016x}"
    return model_dir(root, model) / name[:2] / f"{name}.kv"


class SsdTier:
    """``WritableTier`` on a directory. Build it with ``await SsdTier.open(config)``."""

    def __init__(
        self,
        config: SsdTierConfig,
        *,
        events: TierEvents | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config.validate()
        self._cfg = config
        self._events = events
        self._check = BlockChecker(config.model, config.layout)
        self._pool = ThreadPoolExecutor(config.io_threads, thread_name_prefix="kvtier-ssd")
        self._lru: OrderedDict[int, int] = OrderedDict()
        self._total_bytes = 0
        self._stats = TierStats()
        self._degraded = False
        self._clock = clock
        self._last_warning = -float("inf")

    @classmethod
    async def open(cls, config: SsdTierConfig, *, events: TierEvents | None = None) -> SsdTier:
        """Create the tier and rebuild its LRU index from the files already on disk."""
        tier = cls(config, events=events)
        found = await tier._run(scan_blocks, model_dir(config.root, config.model))
        for block_hash, size in found:
            tier._lru[block_hash] = size
            tier._total_bytes += size
        await tier._evict()
        return tier

    @property
    def is_degraded(self) -> bool:
        return self._degraded

    @property
    def used_bytes(self) -> int:
        return self._total_bytes

    def stats(self) -> TierStats:
        return self._stats.snapshot()

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _path(self, block_hash: int) -> Path:
        return block_path(self._cfg.root, self._cfg.model, block_hash)

    def _read(self, block_hash: int) -> _Read:
        try:
            value = self._path(block_hash).read_bytes()
        except FileNotFoundError:
            return None, None, ""
        except OSError as exc:
            return None, None, f"read {block_hash:016x}: {exc}"
        verdict = self._check.verdict(value, block_hash)
        return (value if verdict is Verdict.OK else None), verdict, ""

    async def get_many(self, hashes: Sequence[int]) -> list[bytes | None]:
        reads = await asyncio.gather(*(self._run(self._read, h) for h in hashes))
        self._note([r[2] for r in reads])
        tally(self._stats, [r[1] for r in reads if r[1] is not None])
        damaged = [h for h, (_, v, _) in zip(hashes, reads, strict=True) if v not in (None, Verdict.OK)]
        out: list[bytes | None] = []
        for h, (value, _, _) in zip(hashes, reads, strict=True):
            out.append(value)
            if value is not None:
                self._touch(h, len(value))
                self._stats.hits += 1
                self._stats.read_bytes += len(value)
            else:
                self._stats.misses += 1
                self._total_bytes -= self._lru.pop(h, 0)  # gone (evicted by another process) or damaged
        if damaged:
            await self.delete_many(damaged)
        return out

    def _touch(self, block_hash: int, size: int) -> None:
        old = self._lru.pop(block_hash, None)
        self._total_bytes += size - (old or 0)
        self._lru[block_hash] = size

    def _note(self, results: Sequence[str]) -> None:
        """Count failed file operations (non-empty error texts); warn at most once per interval."""
        errors = [e for e in results if e]
        self._stats.errors += len(errors)
        self._degraded = bool(errors)
        now = self._clock()
        if errors and now - self._last_warning >= self._cfg.log_interval_s:
            self._last_warning = now
            logger.warning(
                "SSD tier: %d operations failed (first: %s); serving misses", len(errors), errors[0]
            )

    def _exists(self, hashes: Sequence[int]) -> list[bool]:
        return [self._path(h).is_file() for h in hashes]

    async def exists_many(self, hashes: Sequence[int]) -> list[bool]:
        known = [h in self._lru for h in hashes]
        unknown = [h for h, k in zip(hashes, known, strict=True) if not k]
        if not unknown:
            return known
        # Files another process wrote into a shared directory are not in this process's index.
        found = iter(await self._run(self._exists, unknown))
        return [k or next(found) for k in known]

    async def contains_prefix(self, hashes: Sequence[int]) -> int:
        return leading_present(await self.exists_many(hashes))

    def _write(self, block_hash: int, value: bytes) -> str:
        """Write one file atomically; return the error text, empty on success."""
        path = self._path(block_hash)
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(value)
                if self._cfg.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return f"write {block_hash:016x}: {exc}"
        return ""

    async def put_many(self, blocks: Sequence[tuple[int, bytes]]) -> int:
        fits = [(h, v) for h, v in blocks if len(v) <= self._cfg.capacity_bytes]
        failed = await asyncio.gather(*(self._run(self._write, h, v) for h, v in fits))
        self._note(failed)
        stored = [(h, v) for (h, v), err in zip(fits, failed, strict=True) if not err]
        for h, v in stored:
            self._touch(h, len(v))
        self._stats.stored_blocks += len(stored)
        self._stats.stored_bytes += sum(len(v) for _, v in stored)
        if self._events is not None:
            self._events.stored([h for h, _ in stored])
        await self._evict()
        return len(stored)

    async def _evict(self) -> None:
        victims: list[int] = []
        while self._total_bytes > self._cfg.capacity_bytes and self._lru:
            block_hash, size = self._lru.popitem(last=False)
            self._total_bytes -= size
            victims.append(block_hash)
        if victims:
            await self._run(self._unlink_all, victims)
            self._stats.evicted += len(victims)
            if self._events is not None:
                self._events.removed(victims)

    def _unlink_all(self, hashes: Sequence[int]) -> list[bool]:
        out = []
        for h in hashes:
            try:
                self._path(h).unlink()
                out.append(True)
            except FileNotFoundError:
                out.append(False)
            except OSError:
                out.append(False)  # the directory is gone or unwritable: nothing left to remove
        return out

    async def delete_many(self, hashes: Sequence[int]) -> int:
        for h in hashes:
            size = self._lru.pop(h, None)
            self._total_bytes -= size or 0
        removed = [h for h, ok in zip(hashes, await self._run(self._unlink_all, hashes), strict=True) if ok]
        if self._events is not None:
            self._events.removed(removed)
        return len(removed)

    async def aclose(self) -> None:
        self._pool.shutdown(wait=True)

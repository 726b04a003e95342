"""Paged KV block accounting with a prefix cache keyed by the KV contract's block hashes (torch-free).

Blocks are fixed-size slots of ``block_size`` tokens from a fixed pool. A block is referenced by every
sequence whose block table holds it; at zero references it joins an LRU free queue but keeps its hash, so a
later prompt with the same prefix finds it again until the block is reused for something else (then a
``removed`` event is emitted). A block's hash is registered once its tokens' KV has been computed
(``commit``), which emits ``stored``. Both the simulated and the real engine use this class; it knows
nothing about tensors. Not thread safe: call it from the engine's step loop only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvgate_core.kvcontract.events import EventType, KVEvent, Tier
from kvgate_core.kvcontract.hashing import chain_hashes

EventSink = Callable[[KVEvent], None]


class NoFreeBlocksError(RuntimeError):
    """Not enough free blocks for the request; nothing was changed."""


@dataclass(slots=True)
class _Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


@dataclass(slots=True)
class _SeqBlocks:
    root: int
    table: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chain hashes of full blocks known so far
    num_committed: int = 0  # leading blocks whose hash is registered or was found cached


class BlockManager:
    """Reference-counted KV blocks, an LRU free queue and a hash → block prefix cache.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block (the KV contract's block size).
        on_event: receives ``stored``/``removed`` events (GPU tier); must not block.
        worker_id: stamped on events.
        clock: wall-clock seconds for event timestamps.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        on_event: EventSink | None = None,
        worker_id: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self._blocks = [_Block(i) for i in range(num_blocks)]
        # Insertion order is LRU order: reuse pops from the front.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cache: dict[int, int] = {}
        self._seqs: dict[str, _SeqBlocks] = {}
        self._on_event = on_event
        self._worker_id = worker_id
        self._clock = clock

    # -- queries ---------------------------------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references (some of them still cached)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cache)

    @property
    def usage(self) -> float:
        """Share of blocks referenced by sequences, in [0, 1]."""
        return 1.0 - len(self._free) / len(self._blocks)

    def cached_hashes(self) -> list[int]:
        return list(self._cache)

    def has_sequence(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def block_table(self, seq_id: str) -> Sequence[int]:
        return self._seqs[seq_id].table

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_cached_prefix_blocks(self, block_hashes: Sequence[int], num_tokens: int | None = None) -> int:
        """Leading blocks of a prompt found in the cache.

        With ``num_tokens`` the match is capped so at least one prompt token is left to compute (an engine
        needs the last token's logits), as vLLM does.
        """
        limit = len(block_hashes)
        if num_tokens is not None:
            limit = min(limit, (num_tokens - 1) // self.block_size)
        n = 0
        cache = self._cache
        while n < limit and block_hashes[n] in cache:
            n += 1
        return n

    def blocks_needed(self, num_tokens: int, block_hashes: Sequence[int]) -> int:
        """Free-queue blocks ``allocate`` would take for this prompt (new ones plus revived cached ones)."""
        return self._blocks_to_take(num_tokens, block_hashes)[1]

    def can_allocate(self, num_tokens: int, block_hashes: Sequence[int]) -> bool:
        return self._blocks_to_take(num_tokens, block_hashes)[1] <= len(self._free)

    # -- mutations -------------------------------------------------------------------------------------

    def allocate(self, seq_id: str, num_tokens: int, block_hashes: Sequence[int], root: int) -> int:
        """Give a new sequence blocks for its ``num_tokens`` prompt, reusing its cached prefix.

        Args:
            seq_id: unique among live sequences.
            num_tokens: prompt length (at least 1).
            block_hashes: kvcontract hashes of the prompt's full blocks (``num_tokens // block_size``).
            root: the chain's root hash (continues the chain for blocks filled during decode).

        Returns:
            The number of leading blocks served from the cache (their KV need not be computed).

        Raises:
            NoFreeBlocksError: not enough free blocks; nothing changed.
            ValueError: bad arguments or ``seq_id`` already live.
        """
        if num_tokens < 1 or seq_id in self._seqs:
            raise ValueError(f"cannot allocate sequence {seq_id!r} with {num_tokens} tokens")
        if len(block_hashes) != num_tokens // self.block_size:
            raise ValueError("block_hashes must hold one hash per full block of the prompt")
        num_hit, needed = self._blocks_to_take(num_tokens, block_hashes)
        if needed > len(self._free):
            raise NoFreeBlocksError(f"{needed} free blocks needed, {len(self._free)} available")
        seq = _SeqBlocks(root=root, hashes=list(block_hashes), num_committed=num_hit)
        for h in block_hashes[:num_hit]:
            seq.table.append(self._take_cached(self._cache[h]))
        removed = [self._take_free(seq.table) for _ in range(self.blocks_for(num_tokens) - num_hit)]
        self._seqs[seq_id] = seq
        self._emit(EventType.REMOVED, [h for h in removed if h is not None])
        return num_hit

    def append_slots(self, seq_id: str, num_tokens: int) -> bool:
        """Grow the table to hold ``num_tokens`` tokens in all; False (and no change) when out of blocks."""
        seq = self._seqs[seq_id]
        extra = self.blocks_for(num_tokens) - len(seq.table)
        if extra <= 0:
            return True
        if extra > len(self._free):
            return False
        removed = [self._take_free(seq.table) for _ in range(extra)]
        self._emit(EventType.REMOVED, [h for h in removed if h is not None])
        return True

    def commit(self, seq_id: str, token_ids: Sequence[int]) -> None:
        """Register the hashes of the full blocks of ``token_ids`` (tokens whose KV is now computed).

        ``token_ids`` is the sequence's whole computed prefix (prompt, then generated tokens). A block whose
        hash another block already holds stays unregistered (a duplicate is freed as a plain block).
        """
        seq = self._seqs[seq_id]
        num_full = min(len(token_ids) // self.block_size, len(seq.table))
        if num_full <= seq.num_committed:
            return
        if num_full > len(seq.hashes):
            start = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else seq.root
            seg = token_ids[start * self.block_size : num_full * self.block_size]
            seq.hashes.extend(chain_hashes(seg, parent, self.block_size))
        stored: list[int] = []
        for i in range(seq.num_committed, num_full):
            block, h = self._blocks[seq.table[i]], seq.hashes[i]
            if h not in self._cache and block.block_hash is None:
                block.block_hash = h
                self._cache[h] = block.block_id
                stored.append(h)
        seq.num_committed = num_full
        self._emit(EventType.STORED, stored)

    def free(self, seq_id: str) -> None:
        """Drop a finished or aborted sequence; its cached blocks stay findable until reused."""
        seq = self._seqs.pop(seq_id)
        # Reverse order: a prefix's tail is evicted before its head, which more prompts share.
        for block_id in reversed(seq.table):
            block = self._blocks[block_id]
            if block.ref_count <= 0:
                raise AssertionError(f"block {block_id} freed with ref_count {block.ref_count}")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

    def block_of(self, block_hash: int) -> int | None:
        """The block holding ``block_hash``'s KV, or None when it is not cached."""
        return self._cache.get(block_hash)

    def import_blocks(self, chain: Sequence[int], start: int) -> list[int | None]:
        """Register ``chain[start:]`` as cached blocks whose KV the caller writes (a shared-tier pull).

        The cached blocks of ``chain[:start]`` are first moved to the back of the free queue so the import
        cannot evict its own prefix. Each imported hash takes the least recently freed block, unreferenced
        and cached, so the next ``allocate`` of a prompt with this prefix finds it as a hit. Stops early
        when free blocks run out.

        Returns:
            One entry per hash of ``chain[start:]``: the block to write its KV into, or None when the hash
            was cached already (nothing to write). Shorter than ``chain[start:]`` when blocks ran out.
        """
        protected = 0  # blocks at the back of the free queue that must stay
        for h in chain[:start]:
            block_id = self._cache.get(h)
            if block_id is not None and block_id in self._free:
                self._free.move_to_end(block_id)
                protected += 1
        out: list[int | None] = []
        stored: list[int] = []
        removed: list[int] = []
        for h in chain[start:]:
            if h in self._cache:
                out.append(None)
                continue
            if len(self._free) <= protected:
                break
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            if block.block_hash is not None:
                removed.append(block.block_hash)
                del self._cache[block.block_hash]
            block.block_hash = h
            self._cache[h] = block_id
            self._free[block_id] = None  # cached and unreferenced, most recently used
            protected += 1
            out.append(block_id)
            stored.append(h)
        self._emit(EventType.REMOVED, removed)
        self._emit(EventType.STORED, stored)
        return out

    def clear_cache(self) -> int:
        """Forget every unreferenced cached block (emits ``removed``); returns how many were dropped."""
        dropped = [h for h, b in self._cache.items() if self._blocks[b].ref_count == 0]
        for h in dropped:
            self._blocks[self._cache.pop(h)].block_hash = None
        self._emit(EventType.REMOVED, dropped)
        return len(dropped)

    # -- internals -------------------------------------------------------------------------------------

    def _blocks_to_take(self, num_tokens: int, block_hashes: Sequence[int]) -> tuple[int, int]:
        """(cached prefix blocks, blocks that would leave the free queue) for a new prompt."""
        num_hit = self.num_cached_prefix_blocks(block_hashes, num_tokens)
        revived = sum(1 for h in block_hashes[:num_hit] if self._blocks[self._cache[h]].ref_count == 0)
        return num_hit, self.blocks_for(num_tokens) - num_hit + revived

    def _take_cached(self, block_id: int) -> int:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1
        return block_id

    def _take_free(self, table: list[int]) -> int | None:
        """Pop the least recently freed block into ``table``; returns the hash it evicted, if any."""
        block_id, _ = self._free.popitem(last=False)
        block = self._blocks[block_id]
        block.ref_count = 1
        table.append(block_id)
        evicted, block.block_hash = block.block_hash, None
        if evicted is not None:
            del self._cache[evicted]
        return evicted

    def _emit(self, kind: EventType, hashes: list[int]) -> None:
        if hashes and self._on_event is not None:
            self._on_event(KVEvent(self._worker_id, kind, Tier.GPU, tuple(hashes), self._clock()))

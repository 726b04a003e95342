"""A bounded LRU prefix cache of full KV blocks, the way a paged engine keeps them.

A prompt is cut into blocks of ``block_size`` tokens; each block is named by a 64-bit chain hash
(``xxh3_64`` of its token ids seeded with the parent block's hash; the first block's seed is the cache
namespace: ``cache_salt`` and LoRA name, 0 without either). ``match`` counts the cached prefix in whole
blocks, ``insert`` stores the blocks that are missing and evicts least recently used ones when the cache is
full. Leaves are evicted before their parents (a touched chain is refreshed leaf first), as a radix cache
does, so no cached block is ever unreachable for long.

With ``partial_blocks`` the trailing partial block of a prompt is stored too (TensorRT-LLM's partial reuse
announces such blocks); it never counts in ``match``, which walks whole blocks only.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash


@dataclass(frozen=True, slots=True)
class Block:
    """One cached block: its chain hash, its parent's (None for a first block), its tokens and namespace."""

    hash: int
    parent: int | None
    tokens: tuple[int, ...]
    salt: str | None = None
    lora: str | None = None


def namespace_root(salt: str | None, lora: str | None) -> int:
    """The seed of a prompt's first block hash: 0 without salt or LoRA, else a hash of both."""
    if salt is None and lora is None:
        return 0
    return xxhash.xxh3_64_intdigest(f"{salt or ''}\0{lora or ''}".encode())


def block_hash(tokens: Sequence[int], seed: int) -> int:
    """The chain hash of one block (unsigned 64-bit)."""
    return xxhash.xxh3_64_intdigest(array("I", tokens).tobytes(), seed)


class PrefixCache:
    """LRU of blocks keyed by chain hash.

    Args:
        block_size: tokens per block.
        capacity_blocks: most blocks kept.
        enabled: False: nothing is ever cached (``match`` is 0, ``insert`` stores nothing).
        partial_blocks: store a prompt's trailing partial block too.
    """

    def __init__(
        self, block_size: int, capacity_blocks: int, *, enabled: bool = True, partial_blocks: bool = False
    ) -> None:
        if block_size <= 0 or capacity_blocks <= 0:
            raise ValueError("block_size and capacity_blocks must be positive")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.enabled = enabled
        self.partial_blocks = partial_blocks
        self._blocks: OrderedDict[int, Block] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def chain(self, ids: Sequence[int], root: int, *, with_partial: bool = False) -> list[tuple[int, int]]:
        """(start, hash) of each whole block of ``ids`` (and of the partial tail when asked)."""
        out: list[tuple[int, int]] = []
        seed, bs = root, self.block_size
        end = len(ids) if with_partial else len(ids) - len(ids) % bs
        for start in range(0, end, bs):
            seed = block_hash(ids[start : start + bs], seed)
            out.append((start, seed))
        return out

    def match(self, ids: Sequence[int], root: int = 0) -> int:
        """Tokens of ``ids`` whose whole blocks are cached, as a prefix; refreshes the matched chain."""
        if not self.enabled:
            return 0
        hit: list[int] = []
        for _, h in self.chain(ids, root):
            if h not in self._blocks:
                break
            hit.append(h)
        for h in reversed(hit):
            self._blocks.move_to_end(h)
        return len(hit) * self.block_size

    def insert(
        self, ids: Sequence[int], root: int = 0, *, salt: str | None = None, lora: str | None = None
    ) -> tuple[list[Block], list[Block]]:
        """Store the blocks of ``ids`` not cached yet; returns (stored, evicted), both in order."""
        if not self.enabled:
            return [], []
        stored: list[Block] = []
        touched: list[int] = []
        parent: int | None = None
        for start, h in self.chain(ids, root, with_partial=self.partial_blocks):
            if h not in self._blocks:
                block = Block(h, parent, tuple(ids[start : start + self.block_size]), salt, lora)
                self._blocks[h] = block
                stored.append(block)
            touched.append(h)
            parent = h
        for h in reversed(touched):
            self._blocks.move_to_end(h)
        evicted: list[Block] = []
        keep = set(touched)
        while len(self._blocks) > self.capacity_blocks:
            victim = next((h for h in self._blocks if h not in keep), None)
            if victim is None:  # the prompt alone is larger than the cache: drop its own oldest blocks
                victim = next(iter(self._blocks))
            evicted.append(self._blocks.pop(victim))
        return stored, evicted

    def clear(self) -> list[Block]:
        """Drop every block; returns what was dropped."""
        dropped = list(self._blocks.values())
        self._blocks.clear()
        return dropped

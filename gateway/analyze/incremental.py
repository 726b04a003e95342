"""Tokenize and hash a rendered chat prompt, reusing the cached ids and hashes of its longest known prefix.

See ``prefix_cache`` for why splitting after a special token is exact. Without a usable cache entry this is
one full ``encode`` plus the hash chain; with one it encodes only the text after the cached boundary and
continues the chain from the cached block hashes (``chain_hashes(start=, parent=)``).
"""

from __future__ import annotations

import numpy as np

from gateway.analyze.prefix_cache import BoundaryFinder, CachedPrefix, PrefixTokenCache, prefix_keys
from kvgate_core.kvcontract.hashing import chain_hashes
from kvgate_core.tokenize.tokenizer import Tokenizer

_IDS = np.uint32


class _UnsafeSplitError(Exception):
    """A suffix did not start with its boundary token's id: fall back to full tokenization."""


class IncrementalEncoder:
    """Chat-text tokenization with prefix reuse.

    Args:
        tokenizer: the model's tokenizer (chat text is encoded without special-token post-processing).
        cache: the shared prefix cache (``PrefixTokenCache(0)`` disables reuse).
        block_size: tokens per hashed block.
    """

    __slots__ = ("_block_size", "_cache", "_finder", "_ids", "_tok")

    def __init__(self, tokenizer: Tokenizer, cache: PrefixTokenCache, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self._tok = tokenizer
        self._cache = cache
        self._block_size = block_size
        self._finder = BoundaryFinder.for_tokenizer(tokenizer)
        self._ids = {t: tokenizer.token_to_id(t) for t in self._finder.boundary_tokens}

    @property
    def cache(self) -> PrefixTokenCache:
        return self._cache

    def full(self, text: str, root: int) -> tuple[list[int], list[int]]:
        """Ids and full-block hashes of ``text``, computed from scratch."""
        ids = self._tok.encode(text, add_special_tokens=False)
        return ids, chain_hashes(ids, root, self._block_size)

    def encode(self, text: str, root: int) -> tuple[np.ndarray | list[int], list[int]]:
        """Ids and full-block hashes of ``text`` (equal to ``full``), reusing and refreshing the cache."""
        bounds = self._finder.boundaries(text) if self._cache.enabled else []
        if not bounds:
            return self.full(text, root)
        keys = prefix_keys(text, bounds, root, self._block_size)
        found = self._cache.lookup(keys)
        last = bounds[-1]
        try:
            if found is None:
                head = np.asarray(self._tok.encode(text[: last.end]), dtype=_IDS)
                cached: tuple[int, ...] = ()
            else:
                i, entry = found
                head, cached = entry.ids, entry.hashes
                if i < len(bounds) - 1:
                    mid = self._after(bounds[i].token, text[bounds[i].end : last.end])
                    head = np.concatenate((head, np.asarray(mid, dtype=_IDS)))
            tail = self._after(last.token, text[last.end :])
        except _UnsafeSplitError:
            return self.full(text, root)
        ids = np.concatenate((head, np.asarray(tail, dtype=_IDS))) if tail else head
        start = len(cached)
        hashes = [
            *cached,
            *chain_hashes(ids, root, self._block_size, start=start, parent=cached[-1] if start else None),
        ]
        head.flags.writeable = False  # shared by later requests through the cache (and maybe returned as ids)
        self._cache.store(keys[-1], CachedPrefix(head, tuple(hashes[: len(head) // self._block_size])))
        return ids, hashes

    def _after(self, token: str, text: str) -> list[int]:
        """Ids of ``text`` as it tokenizes right after the boundary token ``token``."""
        if not text:
            return []
        token_id = self._ids.get(token)
        ids = self._tok.encode(token + text, add_special_tokens=False)
        if not ids or token_id is None or ids[0] != token_id:
            raise _UnsafeSplitError(token)
        del ids[0]
        return ids

"""Tokenize and hash a rendered chat prompt, reusing the cached ids and hashes of its longest known prefix.

See ``prefix_cache`` for why splitting after a special token is exact. Without a usable cache entry this is
one full ``encode`` plus the hash chain; with one it encodes only the text after the cached boundary and
continues the chain from the cached block hashes (``chain_hashes(start=, parent=)``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gateway.analyze.prefix_cache import BoundaryFinder, CachedPrefix, PrefixTokenCache
from kvgate_core.kvcontract.hashing import chain_hashes
from kvgate_core.tokenize.pieces import DEFAULT_MAX_PIECES, PieceEncoder
from kvgate_core.tokenize.tokenizer import ByteTokenizer, Tokenizer

_IDS = np.uint32
_NO_IDS = np.empty(0, _IDS)
_NO_IDS.flags.writeable = False


class _UnsafeSplitError(Exception):
    """A suffix did not start with its boundary token's id: fall back to full tokenization."""


class IncrementalEncoder:
    """Chat-text tokenization with prefix reuse.

    Args:
        tokenizer: the model's tokenizer (chat text is encoded without special-token post-processing).
        cache: the shared prefix cache (``PrefixTokenCache(0)`` disables reuse).
        block_size: tokens per hashed block.
        max_pieces: size of the cache of space-led pieces that new text is encoded through, where the
            tokenizer allows it (``kvgate_core.tokenize.pieces``); 0 encodes every text whole.
    """

    __slots__ = ("_block_size", "_cache", "_encode_text", "_finder", "_ids", "_tok")

    def __init__(
        self,
        tokenizer: Tokenizer,
        cache: PrefixTokenCache,
        block_size: int,
        *,
        max_pieces: int = DEFAULT_MAX_PIECES,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self._tok = tokenizer
        pieces = PieceEncoder.for_tokenizer(tokenizer, max_pieces)
        self._encode_text: Callable[[str], np.ndarray]
        if pieces is not None:
            self._encode_text = pieces.encode
        elif isinstance(tokenizer, ByteTokenizer):
            self._encode_text = tokenizer.encode_ids
        else:
            self._encode_text = lambda text: np.asarray(tokenizer.encode(text), _IDS)
        self._cache = cache
        self._block_size = block_size
        self._finder = BoundaryFinder.for_tokenizer(tokenizer)
        self._ids = {t: tokenizer.token_to_id(t) for t in self._finder.boundary_tokens}

    @property
    def cache(self) -> PrefixTokenCache:
        return self._cache

    def full(self, text: str, root: int) -> tuple[np.ndarray, tuple[int, ...]]:
        """Ids and full-block hashes of ``text``, computed from scratch."""
        ids = self._encode_text(text)
        return ids, tuple(chain_hashes(ids, root, self._block_size))

    def encode(self, text: str, root: int) -> tuple[np.ndarray, tuple[int, ...]]:
        """Ids and full-block hashes of ``text`` (equal to ``full``), reusing and refreshing the cache."""
        bounds = self._finder.find(text, root, self._block_size) if self._cache.enabled else None
        if not bounds:
            return self.full(text, root)
        ends, tokens = bounds.ends, bounds.tokens
        found = self._cache.lookup(bounds.keys)
        last = len(ends) - 1
        try:
            if found is None:
                head = self._encode_text(text[: ends[last]])
                cached: tuple[int, ...] = ()
            else:
                i, entry = found
                head, cached = entry.ids, entry.hashes
                if i < last:
                    # boundary by boundary: each message's opening and end are then pieces seen before
                    # (``PieceEncoder``), where the text across a message end is not
                    mid = [self._after(tokens[j], text[ends[j] : ends[j + 1]]) for j in range(i, last)]
                    head = np.concatenate((head, *mid))
            tail = self._after(tokens[last], text[ends[last] :])
        except _UnsafeSplitError:
            return self.full(text, root)
        ids = np.concatenate((head, tail)) if len(tail) else head
        # the chain continues from the last cached block: only the new blocks' tokens are read
        start = len(cached)
        new = chain_hashes(ids[start * self._block_size :], cached[-1], self._block_size) if start else None
        hashes = (*cached, *new) if new is not None else tuple(chain_hashes(ids, root, self._block_size))
        head.flags.writeable = False  # shared by later requests through the cache (and maybe returned as ids)
        self._cache.store(bounds.keys[last], CachedPrefix(head, hashes[: len(head) // self._block_size]))
        return ids, hashes

    def _after(self, token: str, text: str) -> np.ndarray:
        """Ids of ``text`` as it tokenizes right after the boundary token ``token``."""
        if not text:
            return _NO_IDS
        token_id = self._ids.get(token)
        ids = self._encode_text(token + text)
        if not len(ids) or token_id is None or ids[0] != token_id:
            raise _UnsafeSplitError(token)
        return ids[1:]

"""Reuse of a conversation's earlier token ids, so a new chat turn tokenizes and hashes only its new suffix.

Why it is exact: Hugging Face tokenizers (and ``ByteTokenizer``) split the input at added tokens *first*, and
then tokenize each piece between them on its own. So right after a special token ``S`` (``<|im_end|>``,
``<|im_start|>``…) the ids of ``text`` are the ids of ``text[:b]`` followed by the ids of ``S + text[b:]``
without their first id (``S``'s). Keeping ``S`` in front of the suffix keeps everything that depends on
position identical (``lstrip``/``rstrip`` of ``S``, a Metaspace ``prepend_scheme="first"``). The finder
matches *all* added tokens leftmost-longest, as the library does, and uses only special, non-normalised,
non-single-word ones as boundaries. Tests compare the cached path with full tokenization.

The cache maps (hash root, block size, prefix length, xxh3 of the rendered text up to a boundary) to that
prefix's ids and block hashes. Each request stores one entry, at its last boundary; the next turn of the
conversation renders the same text up to there. It is bounded by total cached tokens (LRU), thread safe,
and serves one tokenizer (share it only between analyzers of the same tokenizer).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import xxhash

from kvgate_core.tokenize.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

DEFAULT_MAX_CACHED_TOKENS: Final = 4_000_000


@dataclass(frozen=True, slots=True)
class Boundary:
    """A position right after a boundary token ``token`` in a rendered prompt."""

    end: int
    token: str


class BoundaryFinder:
    """Finds the positions after special tokens where a tokenization may be split exactly.

    Args:
        added_tokens: every added token of the tokenizer (special or not), as the library matches them.
        boundary_tokens: the subset that are safe split points.
    """

    __slots__ = ("_boundary", "_pattern")

    def __init__(self, added_tokens: Sequence[str], boundary_tokens: Sequence[str]) -> None:
        self._boundary = frozenset(boundary_tokens)
        alternatives = sorted({t for t in added_tokens if t}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, alternatives))) if self._boundary else None

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> BoundaryFinder:
        """The finder for a tokenizer; one with no known added tokens gets none (caching then never hits)."""
        if isinstance(tokenizer, ByteTokenizer):
            return cls(tokenizer.special_tokens, tokenizer.special_tokens)
        if isinstance(tokenizer, HFTokenizer):
            added = list(tokenizer.rust.get_added_tokens_decoder().values())
            safe = [t.content for t in added if t.special and not t.normalized and not t.single_word]
            return cls([t.content for t in added], safe)
        return cls((), ())

    @property
    def boundary_tokens(self) -> frozenset[str]:
        return self._boundary

    def boundaries(self, text: str) -> list[Boundary]:
        """Boundaries of ``text`` in order; a boundary at the very end of the text is included."""
        if self._pattern is None:
            return []
        boundary = self._boundary
        return [Boundary(m.end(), m.group()) for m in self._pattern.finditer(text) if m.group() in boundary]


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """Token ids of a rendered prefix and the hashes of its full blocks."""

    ids: np.ndarray
    hashes: tuple[int, ...]


# (hash root, block size, prefix length in characters, xxh3 of the prefix text)
CacheKey = tuple[int, int, int, int]


class PrefixTokenCache:
    """LRU map of rendered-text prefixes to their ids and block hashes, bounded by total cached tokens.

    Args:
        max_tokens: the budget; 0 disables the cache.
    """

    __slots__ = ("_entries", "_lock", "_max_tokens", "_tokens", "hits", "misses")

    def __init__(self, max_tokens: int = DEFAULT_MAX_CACHED_TOKENS) -> None:
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        self._max_tokens = max_tokens
        self._entries: OrderedDict[CacheKey, CachedPrefix] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self._max_tokens > 0

    @property
    def num_tokens(self) -> int:
        """Tokens held now (never above ``max_tokens``)."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, keys: Sequence[CacheKey]) -> tuple[int, CachedPrefix] | None:
        """The entry of the longest key found (``keys`` in increasing length) and its index in ``keys``."""
        with self._lock:
            for i in range(len(keys) - 1, -1, -1):
                entry = self._entries.get(keys[i])
                if entry is not None:
                    self._entries.move_to_end(keys[i])
                    self.hits += 1
                    return i, entry
            self.misses += 1
            return None

    def store(self, key: CacheKey, entry: CachedPrefix) -> None:
        """Insert (or refresh) an entry, evicting least recently used ones beyond the budget."""
        size = len(entry.ids)
        if size > self._max_tokens:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._tokens -= len(old.ids)
            self._entries[key] = entry
            self._tokens += size
            while self._tokens > self._max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self._tokens -= len(evicted.ids)


def prefix_keys(text: str, boundaries: Sequence[Boundary], root: int, block_size: int) -> list[CacheKey]:
    """One cache key per boundary: the text prefix up to it, hashed incrementally (one pass over the text).

    A cache must serve one tokenizer only; the root and block size are part of the key because the cached
    block hashes depend on them.
    """
    digest = xxhash.xxh3_64()
    keys: list[CacheKey] = []
    start = 0
    for b in boundaries:
        digest.update(text[start : b.end].encode("utf-8"))
        keys.append((root, block_size, b.end, digest.intdigest()))
        start = b.end
    return keys

"""Reuse of a conversation's earlier token ids, so a new chat turn tokenizes and hashes only its new suffix.

Why it is exact: Hugging Face tokenizers (and ``ByteTokenizer``) split the input at added tokens *first*, and
then tokenize each piece between them on its own. So right after a special token ``S`` (``<|im_end|>``,
``<|im_start|>``…) the ids of ``text`` are the ids of ``text[:b]`` followed by the ids of ``S + text[b:]``
without their first id (``S``'s). Keeping ``S`` in front of the suffix keeps everything that depends on
position identical (``lstrip``/``rstrip`` of ``S``, a Metaspace ``prepend_scheme="first"``). The finder
matches *all* added tokens leftmost-longest, as the library does, and uses only special, non-normalised,
non-single-word ones as boundaries. Tests compare the cached path with full tokenization.

The cache maps (hash root, block size, prefix length, a fingerprint of the rendered text up to a boundary:
``BoundaryFinder.find``) to that prefix's ids and block hashes. Each request stores one entry, at its last
boundary; the next turn of the conversation renders the same text up to there. It is bounded by total
cached tokens (LRU), thread safe, and serves one tokenizer (share it only between analyzers of the same
tokenizer) in one process (the fingerprint uses Python's per-process string hash).
"""

from __future__ import annotations

import operator
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from typing import Final

import numpy as np

from kvgate_core.tokenize.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

DEFAULT_MAX_CACHED_TOKENS: Final = 4_000_000


@dataclass(frozen=True, slots=True)
class Boundaries:
    """The positions right after the boundary tokens of a rendered prompt, in order, with their cache keys.

    Attributes:
        ends: each boundary's position (the end of its token) in the text.
        tokens: each boundary's token.
        keys: each boundary's ``CacheKey`` (the text up to it).
    """

    ends: list[int]
    tokens: list[str]
    keys: list[CacheKey]

    def __len__(self) -> int:
        return len(self.ends)


_NO_BOUNDARIES = Boundaries([], [], [])
#: odd 64-bit multiplier of the prefix fingerprint (``BoundaryFinder.find``)
_PRIME: Final = 0x9E3779B97F4A7C15
_PRIME_POWERS_STEP: Final = 256


class BoundaryFinder:
    """Finds the positions after special tokens where a tokenization may be split exactly.

    Args:
        added_tokens: every added token of the tokenizer (special or not), as the library matches them.
        boundary_tokens: the subset that are safe split points.
    """

    __slots__ = ("_boundary", "_powers", "_splitter", "_unfiltered")

    def __init__(self, added_tokens: Sequence[str], boundary_tokens: Sequence[str]) -> None:
        self._boundary = frozenset(boundary_tokens)
        alternatives = sorted({t for t in added_tokens if t}, key=len, reverse=True)
        # one capturing group: ``split`` returns text, token, text, token, …, text, matched leftmost-longest
        # as the library matches added tokens (the longest alternative first)
        self._splitter = (
            re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if self._boundary else None
        )
        self._unfiltered = self._boundary >= set(alternatives)
        self._powers = np.empty(0, np.uint64)

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

    def find(self, text: str, root: int, block_size: int) -> Boundaries:
        """The boundaries of ``text`` (one at its very end included) and their cache keys.

        Every step is a C-level pass over the text or the matches (no Python per boundary): one regex
        ``split``, the texts between boundaries hashed (``hash``), and each prefix's key a fingerprint of the
        hashes up to it (``sum(h_i * P**i) mod 2**64``: position-sensitive, so reordered segments differ),
        beside the prefix's length. ``root`` and ``block_size`` are part of every key because the cached
        block hashes depend on them.
        """
        if self._splitter is None:
            return _NO_BOUNDARIES
        parts = self._splitter.split(text)
        if len(parts) == 1:
            return _NO_BOUNDARIES
        segments, tokens = parts[0::2], parts[1::2]  # one more segment than tokens: the text after the last
        ends = list(accumulate(map(operator.add, map(len, segments), map(len, tokens))))
        # Python's own str hash (SipHash, keyed per process; the cache lives in this process): no UTF-8
        # encoding of the text first, which costs more than hashing it
        digests = np.fromiter(
            map(hash, map(operator.add, segments, tokens)), dtype=np.int64, count=len(tokens)
        ).view(np.uint64)
        prints = np.cumsum(digests * self._prime_powers(len(tokens)), dtype=np.uint64).tolist()
        keys = list(zip(repeat(root), repeat(block_size), ends, prints, strict=False))
        if not self._unfiltered:  # an added token that is no safe split point ends no boundary
            keep = list(map(self._boundary.__contains__, tokens))
            ends, tokens, keys = (list(compress(v, keep)) for v in (ends, tokens, keys))
        return Boundaries(ends, tokens, keys)

    def _prime_powers(self, n: int) -> np.ndarray:
        powers = self._powers
        if len(powers) < n:  # grown in steps, replaced whole (another thread may read the old one)
            size = -(-n // _PRIME_POWERS_STEP) * _PRIME_POWERS_STEP
            powers = np.empty(size, np.uint64)
            powers[0] = 1
            with np.errstate(over="ignore"):
                for i in range(1, size):
                    powers[i] = powers[i - 1] * np.uint64(_PRIME)
            self._powers = powers
        return powers[:n]


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """Token ids of a rendered prefix and the hashes of its full blocks."""

    ids: np.ndarray
    hashes: tuple[int, ...]


# (hash root, block size, prefix length in characters, fingerprint of the prefix text)
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

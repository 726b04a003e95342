"""Prefix block hashing: the one implementation of the KV contract's hash scheme.

Tokens are split into blocks of ``block_size``; only full blocks are hashed. The chain starts from a root
hash of the model id and any extra keys (LoRA name, cache salt, tenant), and every block hash is seeded by
the previous one, so a block hash names the whole prefix up to and including that block::

    h[-1] = xxh3_64(model_id [+ "\\x00" + extra_key ...])
    h[i]  = xxh3_64(le_uint32(tokens of block i), seed=h[i-1])

Workers and the gateway both import this module; foreign engines get adapters elsewhere that implement the
``HashScheme`` protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NewType, Protocol

import numpy as np
import xxhash

BlockHash = NewType("BlockHash", int)

DEFAULT_BLOCK_SIZE: Final = 16
_TOKEN_DTYPE: Final = np.dtype("<u4")
_TOKEN_BYTES: Final = 4


class HashScheme(Protocol):
    """Turns a token sequence into chained block hashes.

    Implementations are pure and thread safe. ``block_hashes`` returns one hash per *full* block, in order;
    a prompt shorter than one block has no hashes.
    """

    block_size: int

    def root(self, model: str, extra_keys: Sequence[str] = ()) -> int:
        """The chain's seed for a model and its extra keys (LoRA, cache salt, tenant)."""
        ...

    def block_hashes(
        self, tokens: Sequence[int] | np.ndarray, root: int, *, start: int = 0, parent: int | None = None
    ) -> list[int]:
        """Hashes of the full blocks of ``tokens`` from block index ``start`` on.

        ``parent`` is the hash of block ``start - 1`` (required when ``start > 0``): it lets a caller that
        already hashed a prefix continue the chain without rehashing it.
        """
        ...


def root_hash(model: str, extra_keys: Sequence[str] = ()) -> int:
    """Seed of the hash chain: xxh3_64 of the model id and the extra keys joined by NUL bytes."""
    key = "\x00".join([model, *extra_keys]) if extra_keys else model
    return xxhash.xxh3_64_intdigest(key.encode("utf-8"))


def as_token_array(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Tokens as a contiguous little-endian uint32 array (the contract's byte layout).

    Raises:
        ValueError: a token id is negative or does not fit in 32 bits.
    """
    arr = np.asarray(tokens)
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError("token ids must be in [0, 2**32)")
    return np.ascontiguousarray(arr, dtype=_TOKEN_DTYPE)


def chain_hashes(
    tokens: Sequence[int] | np.ndarray,
    root: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    start: int = 0,
    parent: int | None = None,
) -> list[int]:
    """Chained xxh3_64 hashes of the full blocks of ``tokens``, beginning at block ``start``.

    Args:
        tokens: the whole token sequence (not only the blocks from ``start``).
        root: the chain's seed, from ``root_hash``.
        block_size: tokens per block.
        start: index of the first block to hash.
        parent: hash of block ``start - 1``; ignored when ``start == 0``.

    Returns:
        One hash per full block from ``start`` on.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if start > 0 and parent is None:
        raise ValueError("parent is required when start > 0")
    buf = as_token_array(tokens).data.cast("B")
    n_full = len(buf) // (block_size * _TOKEN_BYTES)
    step = block_size * _TOKEN_BYTES
    seed = root if start == 0 else parent
    assert seed is not None, "seed resolved above"
    digest = xxhash.xxh3_64_intdigest
    out: list[int] = []
    append = out.append
    for i in range(start, n_full):
        seed = digest(buf[i * step : (i + 1) * step], seed)
        append(seed)
    return out


@dataclass(frozen=True, slots=True)
class Xxh3ChainScheme:
    """kvgate's block hash scheme: chained xxh3_64 over uint32-LE token blocks."""

    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError("block_size must be positive")

    def root(self, model: str, extra_keys: Sequence[str] = ()) -> int:
        return root_hash(model, extra_keys)

    def block_hashes(
        self, tokens: Sequence[int] | np.ndarray, root: int, *, start: int = 0, parent: int | None = None
    ) -> list[int]:
        return chain_hashes(tokens, root, self.block_size, start=start, parent=parent)

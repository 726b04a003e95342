"""Longest-prefix scan over per-block holder bitmasks, shared by the precise and approximate indexes.

Each index keeps ``block hash -> int bitmask`` of the workers holding that block (one bit per worker). A
request's leading-block count for worker ``w`` is the length of the run of blocks, from the first, whose
mask has ``w``'s bit. The scan is exact (a hole ends the match, whatever the chaining suggests) and runs in
C for the common part: ``map(dict.get)`` fetches the masks, ``itertools.accumulate(and)`` intersects them and
``takewhile`` stops at the first block no worker holds. Because the running intersection only ever loses
bits, it is non-increasing as an integer and each worker's count is found by a binary search over it.
Tier continuation (``dram``/``ssd`` after the GPU match) is computed once per distinct GPU count.

Why not a binary search over the prompt (chaining makes "block i cached" usually imply its ancestors are):
a worker can hold a block whose ancestor it evicted, and then it cannot serve the block; a probe-based
search would claim it. The exact scan costs O(longest match) C-level steps, measured by
``loadtest/bench_index.py``.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, repeat, takewhile

from gateway.kvindex.index import PrefixHit

MaskGetter = Callable[[int, int], int]
_MISS = PrefixHit()


def leading_masks(hashes: Sequence[int], getters: Sequence[MaskGetter]) -> list[int]:
    """Running AND of the holder masks of ``hashes``, cut at the first all-zero value.

    Args:
        hashes: the request's block hashes, in order.
        getters: ``dict.get``-like callables ``(hash, default) -> mask``; their masks are OR-ed per block.

    Returns:
        ``acc`` where ``acc[i]`` has the bits of the workers holding blocks ``0..i``; ``len(acc)`` is the
        longest match of any worker.
    """
    if not hashes or not getters:
        return []
    zeros = repeat(0)
    masks: Iterable[int] = map(getters[0], hashes, zeros)
    for get in getters[1:]:
        masks = map(operator.or_, masks, map(get, hashes, repeat(0)))
    return list(takewhile(bool, accumulate(masks, operator.and_)))


def leading_run(masks: Mapping[int, int], hashes: Sequence[int], bit: int) -> int:
    """Leading blocks of ``hashes`` whose mask in ``masks`` has ``bit`` (exact, in C: stops at the first
    block without it)."""
    held = map(operator.and_, map(masks.get, hashes, repeat(0)), repeat(bit))
    try:
        return operator.indexOf(held, 0)
    except ValueError:
        return len(hashes)


def count_for_bit(acc: Sequence[int], bit: int) -> int:
    """Leading blocks whose running mask still has ``bit`` (``acc`` from ``leading_masks``)."""
    if not acc or not acc[0] & bit:
        return 0
    if acc[-1] & bit:
        return len(acc)
    return bisect.bisect_left(acc, True, key=lambda v: not v & bit)


def tier_run(hashes: Sequence[int], start: int, in_tier: Callable[[int], object]) -> int:
    """Consecutive blocks from ``start`` present in a shared tier."""
    n = 0
    for h in hashes[start:]:
        if not in_tier(h):
            break
        n += 1
    return n


def prefix_hits(
    hashes: Sequence[int],
    workers: Iterable[str],
    bits: Mapping[str, int],
    getters: Sequence[MaskGetter],
    tier: Mapping[int, int] | None = None,
) -> dict[str, PrefixHit]:
    """Per worker GPU leading match plus the shared-tier continuation after it.

    Args:
        hashes: the request's block hashes, in order.
        workers: workers to answer for (unknown ones get a zero GPU match).
        bits: worker -> its bit in the masks.
        getters: mask lookups (events, predictions, ...), OR-ed per block.
        tier: block hash -> non-zero when the block sits in a shared tier; ``None`` or empty for no tier.
    """
    acc = leading_masks(hashes, getters)
    tier_get = tier.get if tier else None
    if not acc and (tier_get is None or not hashes or not tier_get(hashes[0])):
        return dict.fromkeys(workers, _MISS)
    runs: dict[int, int] = {}
    out: dict[str, PrefixHit] = {}
    for worker in workers:
        bit = bits.get(worker, 0)
        gpu = count_for_bit(acc, bit) if bit else 0
        extra = 0
        if tier_get is not None and gpu < len(hashes):
            extra = runs.get(gpu, -1)
            if extra < 0:
                extra = runs[gpu] = tier_run(hashes, gpu, tier_get)
        out[worker] = PrefixHit(gpu_blocks=gpu, tier_blocks=extra)
    return out

"""Triton kernel: write new K/V rows into their paged-cache slots.

Layouts assumed (asserted in ``store_kv``):

- ``k``, ``v``: ``[T, Hkv, D]``; any row stride (e.g. a slice of a fused QKV projection), but each row's
  ``Hkv * D`` values contiguous: ``stride(1) == D``, ``stride(2) == 1``.
- ``k_cache``, ``v_cache``: ``[num_blocks, block_size, Hkv, D]`` contiguous, so slot ``s`` starts at
  element ``s * Hkv * D``.
- ``slot_mapping``: ``[T]`` int64, ``block_id * block_size + offset``; ``-1`` skips the row.

One program per token copies its ``Hkv * D`` values for K and for V.
"""

# ruff: noqa: N803  (Triton constexpr parameters are upper case by convention)
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def _store_kv_kernel(  # type: ignore[no-untyped-def]
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_k,
    stride_v,
    ROW: tl.constexpr,
    ROW_P: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot < 0:
        return
    cols = tl.arange(0, ROW_P)
    mask = cols < ROW
    k = tl.load(k_ptr + token.to(tl.int64) * stride_k + cols, mask=mask)
    v = tl.load(v_ptr + token.to(tl.int64) * stride_v + cols, mask=mask)
    dst = slot.to(tl.int64) * ROW + cols
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k``/``v`` (``[T, Hkv, D]``) into their cache slots in place; slot ``-1`` is skipped."""
    num_tokens, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape, "k and v must both be [T, Hkv, D]"
    assert k.stride(2) == 1, "k rows must be contiguous over (Hkv, D)"
    assert k.stride(1) == head_dim, "k rows must be contiguous over (Hkv, D)"
    assert v.stride(2) == 1, "v rows must be contiguous over (Hkv, D)"
    assert v.stride(1) == head_dim, "v rows must be contiguous over (Hkv, D)"
    assert k_cache.is_contiguous(), "caches must be contiguous"
    assert v_cache.is_contiguous(), "caches must be contiguous"
    assert k_cache.shape == v_cache.shape
    assert k_cache.shape[2:] == (num_kv_heads, head_dim)
    assert slot_mapping.shape == (num_tokens,)
    assert slot_mapping.dtype == torch.int64
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        v.stride(0),
        ROW=row,
        ROW_P=triton.next_power_of_2(row),
        enable_fp_fusion=True,  # explicit: Triton 3.9 warns when it is left to the default
    )

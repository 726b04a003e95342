"""Triton kernel: paged decode attention (one query token per sequence) with grouped-query heads.

Layouts assumed (asserted in ``paged_decode_attention``):

- ``q``: ``[B, H, D]`` with ``stride(2) == 1``; output ``[B, H, D]`` contiguous, same dtype.
- ``k_cache``, ``v_cache``: ``[num_blocks, block_size, Hkv, D]`` contiguous: position ``t`` of a
  sequence lives at ``table[t // block_size] * stride(0) + (t % block_size) * stride(1) + kvh * D``.
- ``block_tables``: ``[B, max_blocks]`` int32, row stride ``stride(0)``, ``stride(1) == 1``.
- ``context_lens``: ``[B]`` int32, all >= 1.

One program per (sequence, KV head) handles that KV head's ``H // Hkv`` query heads (padded to 16 rows
for ``tl.dot``), streams the context in tiles of ``tile`` positions and keeps an online softmax.
With ``UPCAST`` (fp32 inputs, or the CPU interpreter whose low-precision ``tl.dot`` is wrong) the dots
run in fp32 ("ieee"); otherwise they run on fp16/bf16 inputs with fp32 accumulation.
"""

# ruff: noqa: N803  (Triton constexpr parameters are upper case by convention)
from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit  # type: ignore[untyped-decorator]
def _decode_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, lens_ptr, out_ptr, qk_scale,
    stride_qb, stride_qh, stride_ob, stride_oh, stride_cb, stride_ct, stride_tb,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, D_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    ctx = tl.load(lens_ptr + seq)
    rows = tl.arange(0, GROUP_P)
    dims = tl.arange(0, D_P)
    heads = kvh * GROUP + rows
    q_mask = (rows < GROUP)[:, None] & (dims < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, D_P], tl.float32)
    table_row = tables_ptr + seq.to(tl.int64) * stride_tb
    for start in range(0, ctx, TILE):
        pos = start + tl.arange(0, TILE)
        valid = pos < ctx
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        base = block * stride_cb + (pos % BLOCK_SIZE) * stride_ct + kvh * HEAD_DIM
        kv_mask = valid[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(k_cache_ptr + base[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + base[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee") if UPCAST else tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / l_i[:, None]
    out_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    tile: int = 64,
) -> torch.Tensor:
    """One query token per sequence (``q``: ``[B, H, D]``) over its paged context; returns ``[B, H, D]``.

    ``tile`` (a power of two >= 16) is the number of context positions per loop iteration.
    """
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert q.stride(2) == 1, "q: [*, H, D] with head_dim contiguous"
    assert k_cache.is_contiguous(), "k_cache: contiguous [num_blocks, block_size, Hkv, D]"
    assert v_cache.is_contiguous(), "v_cache: contiguous [num_blocks, block_size, Hkv, D]"
    assert k_cache.shape == v_cache.shape, "k_cache and v_cache must have the same shape"
    assert k_cache.shape[3] == head_dim, "q and the caches must share head_dim"
    assert num_heads % num_kv_heads == 0, "GQA: H must be a multiple of Hkv"
    assert block_tables.dtype == torch.int32, "block_tables: int32"
    assert block_tables.stride(1) == 1, "block_tables: rows contiguous"
    assert block_tables.shape[0] == batch, "block_tables: one row per sequence"
    assert context_lens.dtype == torch.int32, "context_lens: int32"
    assert context_lens.shape == (batch,), "context_lens: [B]"
    assert tile >= 16, "tile must be >= 16 (tl.dot)"
    assert tile & (tile - 1) == 0, "tile must be a power of two"
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=q.device)
    group = num_heads // num_kv_heads
    _decode_kernel[(batch, num_kv_heads)](
        q, k_cache, v_cache, block_tables, context_lens, out, scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        GROUP=group, GROUP_P=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, D_P=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, TILE=tile,
        UPCAST=q.dtype == torch.float32 or q.device.type == "cpu",
        enable_fp_fusion=True,  # explicit: Triton 3.9 warns when it is left to the default
    )  # fmt: skip
    return out

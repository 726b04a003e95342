"""Triton kernel: causal prefill attention over a paged KV cache with a cached prefix (flash-attention style).

Layouts assumed (asserted in ``paged_prefill_attention``):

- ``q``: ``[T_total, H, D]`` with ``stride(2) == 1``, the new tokens of all sequences packed; output
  ``[T_total, H, D]`` contiguous, same dtype.
- ``k_cache``, ``v_cache``: ``[num_blocks, block_size, Hkv, D]`` contiguous: position ``t`` of a
  sequence lives at ``table[t // block_size] * stride(0) + (t % block_size) * stride(1) + kvh * D``.
  The new tokens' K/V are already stored there.
- ``block_tables``: ``[B, max_blocks]`` int32 with ``stride(1) == 1``.
- ``cu_seqlens_q``: ``[B + 1]`` int32; ``context_lens``: ``[B]`` int32 (total KV length incl. new tokens).

Query ``i`` of sequence ``b`` sits at KV position ``ctx_b - q_len_b + i`` and sees positions ``<=`` it.
Grid: (sequence, query tile of ``block_m`` rows, query head); tiles past a sequence's end exit at once,
so the launch needs no host sync. ``UPCAST`` as in ``decode_attention``.
"""

# ruff: noqa: N803  (Triton constexpr parameters are upper case by convention)
from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit  # type: ignore[untyped-decorator]
def _prefill_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, cu_q_ptr, lens_ptr, out_ptr, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_ct, stride_tb,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_P: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    m_start = tl.program_id(1) * BLOCK_M
    head = tl.program_id(2)
    q_begin = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_begin
    if m_start >= q_len:
        return
    ctx = tl.load(lens_ptr + seq)
    kvh = head // GROUP
    rows = m_start + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D_P)
    q_pos = ctx - q_len + rows  # KV position of each query row
    q_mask = (rows < q_len)[:, None] & (dims < HEAD_DIM)[None, :]
    tokens = (q_begin + rows).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + head * stride_qh + dims[None, :], mask=q_mask, other=0.0
    )
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_P], tl.float32)
    table_row = tables_ptr + seq.to(tl.int64) * stride_tb
    kv_end = tl.minimum(ctx, ctx - q_len + m_start + BLOCK_M)  # one past the tile's last visible position
    for start in range(0, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < kv_end
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        base = block * stride_cb + (pos % BLOCK_SIZE) * stride_ct + kvh * HEAD_DIM
        kv_mask = valid[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(k_cache_ptr + base[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + base[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = valid[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee") if UPCAST else tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / l_i[:, None]
    out_ptrs = out_ptr + tokens[:, None] * stride_ot + head * stride_oh + dims[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    block_m: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    """Causal attention of packed new tokens over their cached prefix plus themselves; ``[T_total, H, D]``.

    ``block_m`` / ``block_n`` (powers of two >= 16) are the query and key tile sizes.
    """
    total, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    batch = context_lens.shape[0]
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
    assert cu_seqlens_q.dtype == torch.int32, "cu_seqlens_q: int32"
    assert cu_seqlens_q.shape == (batch + 1,), "cu_seqlens_q: [B + 1]"
    for tile in (block_m, block_n):
        assert tile >= 16, "tiles must be >= 16 (tl.dot)"
        assert tile & (tile - 1) == 0, "tiles must be powers of two"
    out = torch.empty((total, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if total == 0:
        return out
    # Upper bound on query tiles per sequence that needs no host sync.
    grid = (batch, triton.cdiv(total, block_m), num_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, D_P=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n,
        UPCAST=q.dtype == torch.float32 or q.device.type == "cpu",
        enable_fp_fusion=True,  # explicit: Triton 3.9 warns when it is left to the default
    )  # fmt: skip
    return out

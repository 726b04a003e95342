"""Torch reference kernels for the paged KV cache: the CPU path and the test oracle.

Layouts (shared with the Triton kernels, see ``dispatch.Kernels``):

- ``k_cache`` / ``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous.
- ``slot_mapping``: ``[T]`` int64, ``block_id * block_size + offset``; ``-1`` means "do not store".
- ``block_tables``: ``[B, max_blocks]`` int32; only the first ``ceil(context_len / block_size)``
  entries of a row are read.
- ``context_lens``: ``[B]`` int32, the number of KV positions of each sequence (all >= 1).
- ``cu_seqlens_q``: ``[B + 1]`` int32 prefix sums of the query lengths; the queries of sequence ``b``
  are its last ``q_len_b`` KV positions (their K/V are stored in the cache before the call).

Attention is computed in fp32 and the result is cast back to ``q.dtype``. Grouped-query attention
maps query head ``h`` to KV head ``h // (H // Hkv)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k``/``v`` (``[T, Hkv, D]``) into their cache slots in place; slot ``-1`` is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    flat_k = k_cache.view(-1, k_cache.shape[2], k_cache.shape[3])
    flat_v = v_cache.view(-1, v_cache.shape[2], v_cache.shape[3])
    flat_k.index_copy_(0, slots, k[keep].to(k_cache.dtype))
    flat_v.index_copy_(0, slots, v[keep].to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of one sequence: ``[length, Hkv, D]`` (a copy)."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = cache.index_select(0, block_table[:num_blocks].long())
    return blocks.view(num_blocks * block_size, cache.shape[2], cache.shape[3])[:length]


def _gather_batch(cache: torch.Tensor, flat_table: torch.Tensor, batch: int) -> torch.Tensor:
    """``[B, Hkv, nb * block_size, D]`` fp32 from a flattened ``[B * nb]`` block table (a copy)."""
    # index_select on a flat table is far faster on CPU than advanced indexing with a 2-D index.
    blocks = cache.index_select(0, flat_table)
    return blocks.view(batch, -1, cache.shape[2], cache.shape[3]).transpose(1, 2).float()


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence (``q``: ``[B, H, D]``) over its paged context; returns ``[B, H, D]``."""
    batch, _, _ = q.shape
    block_size = k_cache.shape[1]
    lens = context_lens.long()
    num_blocks = -(-int(lens.max()) // block_size)
    table = block_tables[:, :num_blocks].reshape(-1).long().clamp_(min=0)
    k = _gather_batch(k_cache, table, batch)
    v = _gather_batch(v_cache, table, batch)
    positions = torch.arange(num_blocks * block_size, device=q.device)
    mask = (positions[None, :] < lens[:, None]).view(batch, 1, 1, -1)
    out = F.scaled_dot_product_attention(
        q.float().unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.squeeze(2).to(q.dtype)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of new tokens (``q``: ``[T_total, H, D]``) over a cached prefix plus themselves.

    Query ``i`` of sequence ``b`` sits at KV position ``context_len_b - q_len_b + i`` and attends to
    every position up to and including its own. Returns ``[T_total, H, D]``.
    """
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    for b, kv_len in enumerate(lens):
        start, end = starts[b], starts[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        # 4-D inputs take torch's fused CPU attention kernel (3-D ones fall back to the slow math path).
        k = gather_kv(k_cache, block_tables[b], kv_len).transpose(0, 1).unsqueeze(0).float()
        v = gather_kv(v_cache, block_tables[b], kv_len).transpose(0, 1).unsqueeze(0).float()
        qb = q[start:end].transpose(0, 1).unsqueeze(0).float()
        if q_len == kv_len:  # no cached prefix: plain causal
            ob = F.scaled_dot_product_attention(qb, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            query_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
            mask = torch.arange(kv_len, device=q.device)[None, :] <= query_pos[:, None]
            ob = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:end] = ob[0].transpose(0, 1).to(q.dtype)
    return out

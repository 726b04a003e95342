"""Shared test inputs for the paged-attention kernels: case grids, builders, tolerances, a naive oracle.

Imported both by the in-process tests and by ``interp_runner`` (the ``TRITON_INTERPRET=1`` subprocess),
so it must not import triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Max abs error allowed against the reference (outputs are O(1): convex combinations of randn values).
TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 3e-2}


@dataclass(frozen=True, slots=True)
class Case:
    """One shape/dtype point. ``q_lens`` empty means decode (one query per sequence)."""

    dtype: str
    block_size: int
    head_dim: int
    num_kv_heads: int
    group: int  # query heads per KV head
    context_lens: tuple[int, ...]
    q_lens: tuple[int, ...] = ()
    tile: int = 16  # decode tile / prefill block_n
    block_m: int = 16

    @property
    def id(self) -> str:
        q = f"-q{'_'.join(map(str, self.q_lens))}" if self.q_lens else ""
        return (
            f"{self.dtype}-bs{self.block_size}-d{self.head_dim}-kv{self.num_kv_heads}x{self.group}"
            f"-ctx{'_'.join(map(str, self.context_lens))}{q}-t{self.tile}m{self.block_m}"
        )


DECODE_CASES = (
    Case("fp32", 16, 64, 2, 1, (1, 17, 50)),
    Case("fp32", 16, 64, 2, 3, (16, 33, 70), tile=32),
    Case("fp32", 8, 48, 2, 1, (3, 64)),  # head_dim not a power of two
    Case("fp16", 16, 64, 2, 3, (5, 48, 61)),
    Case("fp16", 8, 32, 1, 3, (9, 40)),
    Case("fp16", 16, 128, 1, 3, (30,)),
    Case("bf16", 16, 64, 1, 3, (20, 37)),
)
PREFILL_CASES = (
    Case("fp32", 16, 64, 2, 1, (5, 37), q_lens=(5, 37)),  # no cached prefix
    Case("fp32", 16, 64, 1, 3, (40, 70, 17), q_lens=(7, 33, 1)),  # cached prefix; one decode-like row
    Case("fp32", 8, 48, 1, 2, (21,), q_lens=(13,)),
    Case("fp16", 8, 32, 2, 3, (24, 19, 10), q_lens=(24, 3, 0)),  # an empty query range
    Case("fp16", 16, 64, 1, 3, (50,), q_lens=(40,), block_m=32),
    Case("bf16", 16, 64, 1, 1, (33,), q_lens=(17,)),
)
STORE_CASES = (
    Case("fp32", 16, 64, 2, 1, (20,)),
    Case("fp16", 8, 32, 3, 1, (7,)),
    Case("bf16", 16, 64, 1, 1, (5,)),
)


@dataclass(frozen=True, slots=True)
class PagedInputs:
    """A random paged cache plus queries; ``dense_k``/``dense_v`` hold each sequence's ``[L, Hkv, D]``."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    dense_k: tuple[torch.Tensor, ...]
    dense_v: tuple[torch.Tensor, ...]
    scale: float


def build(case: Case, seed: int = 0) -> PagedInputs:
    """Scatter each sequence over randomly chosen blocks; unused slots hold garbage, table padding is -1."""
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[case.dtype]
    bs, hkv, dim = case.block_size, case.num_kv_heads, case.head_dim
    per_seq = [-(-n // bs) for n in case.context_lens]
    num_blocks = sum(per_seq) + 3
    k_cache = torch.randn(num_blocks, bs, hkv, dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, bs, hkv, dim, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(per_seq), max(per_seq) + 1), -1, dtype=torch.int32)
    for b, n in enumerate(per_seq):
        tables[b, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    dense_k = tuple(_naive_gather(k_cache, tables[b], n) for b, n in enumerate(case.context_lens))
    dense_v = tuple(_naive_gather(v_cache, tables[b], n) for b, n in enumerate(case.context_lens))
    q_lens = case.q_lens or (1,) * len(case.context_lens)
    total = sum(q_lens)
    q = torch.randn(total, hkv * case.group, dim, generator=gen).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return PagedInputs(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables,
        context_lens=torch.tensor(case.context_lens, dtype=torch.int32),
        cu_seqlens_q=cu,
        dense_k=dense_k,
        dense_v=dense_v,
        scale=dim**-0.5,
    )


def _naive_gather(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    bs = cache.shape[1]
    rows = [cache[int(table[p // bs]), p % bs] for p in range(length)]
    return torch.stack(rows)


def naive_attention(inputs: PagedInputs) -> torch.Tensor:
    """Dense causal attention in float64 from the per-sequence K/V: ``[T_total, H, D]`` in ``q.dtype``."""
    q = inputs.q.double()
    out = torch.empty_like(q)
    cu = inputs.cu_seqlens_q.tolist()
    for b, (k, v) in enumerate(zip(inputs.dense_k, inputs.dense_v, strict=True)):
        qb = q[cu[b] : cu[b + 1]]  # [Lq, H, D]
        q_len, kv_len = qb.shape[0], k.shape[0]
        group = qb.shape[1] // k.shape[1]
        kk = k.double().repeat_interleave(group, dim=1)  # [L, H, D]
        vv = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qb, kk) * inputs.scale
        q_pos = torch.arange(kv_len - q_len, kv_len)[:, None]
        scores = scores.masked_fill(torch.arange(kv_len)[None, :] > q_pos, float("-inf"))
        out[cu[b] : cu[b + 1]] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv)
    return out.to(inputs.q.dtype)


def store_inputs(case: Case, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k, v, slot_mapping)`` for ``case.context_lens[0]`` tokens; ``k``/``v`` are row-strided slices
    of one fused buffer (as from a QKV projection) and every third slot is ``-1``."""
    gen = torch.Generator().manual_seed(seed)
    tokens, hkv, dim = case.context_lens[0], case.num_kv_heads, case.head_dim
    fused = torch.randn(tokens, 3 * hkv, dim, generator=gen).to(DTYPES[case.dtype])
    k, v = fused[:, hkv : 2 * hkv], fused[:, 2 * hkv :]
    num_slots = store_cache_blocks(case) * case.block_size
    slots = torch.randperm(num_slots, generator=gen)[:tokens]
    slots[::3] = -1
    return k, v, slots


def store_cache_blocks(case: Case) -> int:
    """Blocks in the cache used by the store cases (room for twice the tokens)."""
    return -(-2 * case.context_lens[0] // case.block_size)

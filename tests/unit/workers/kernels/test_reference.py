"""The torch reference kernels against a naive dense oracle, and the dispatch table."""

from __future__ import annotations

import pytest
import torch

from tests.unit.workers.kernels.paged_cases import (
    DECODE_CASES,
    PREFILL_CASES,
    STORE_CASES,
    TOLERANCE,
    build,
    naive_attention,
    store_cache_blocks,
    store_inputs,
)
from workers.kernels import reference
from workers.kernels.dispatch import Kernels, reference_kernels, select_kernels


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.id)
def test_decode_matches_naive_attention(case):
    x = build(case, seed=1)
    got = reference.paged_decode_attention(x.q, x.k_cache, x.v_cache, x.block_tables, x.context_lens, x.scale)
    assert got.shape == x.q.shape
    assert got.dtype == x.q.dtype
    torch.testing.assert_close(got.float(), naive_attention(x).float(), atol=TOLERANCE[case.dtype], rtol=0)


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: c.id)
def test_prefill_matches_naive_causal_attention(case):
    x = build(case, seed=2)
    got = reference.paged_prefill_attention(
        x.q, x.k_cache, x.v_cache, x.block_tables, x.cu_seqlens_q, x.context_lens, x.scale
    )
    assert got.shape == x.q.shape
    torch.testing.assert_close(got.float(), naive_attention(x).float(), atol=TOLERANCE[case.dtype], rtol=0)


def test_prefill_of_whole_sequence_equals_decode_of_its_last_token():
    case = PREFILL_CASES[0]
    x = build(case, seed=3)
    prefill = reference.paged_prefill_attention(
        x.q, x.k_cache, x.v_cache, x.block_tables, x.cu_seqlens_q, x.context_lens, x.scale
    )
    last_rows = (x.cu_seqlens_q[1:] - 1).long()
    decode = reference.paged_decode_attention(
        x.q[last_rows], x.k_cache, x.v_cache, x.block_tables, x.context_lens, x.scale
    )
    torch.testing.assert_close(decode, prefill[last_rows], atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", STORE_CASES, ids=lambda c: c.id)
def test_store_kv_writes_each_row_to_its_slot_and_skips_minus_one(case):
    k, v, slots = store_inputs(case)
    shape = (store_cache_blocks(case), case.block_size, case.num_kv_heads, case.head_dim)
    k_cache, v_cache = torch.randn(shape).to(k.dtype), torch.randn(shape).to(k.dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            want_k[slot // case.block_size, slot % case.block_size] = k[t]
            want_v[slot // case.block_size, slot % case.block_size] = v[t]
    reference.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k)
    assert torch.equal(v_cache, want_v)
    assert (slots == -1).any()


def test_select_kernels_uses_the_reference_off_cuda():
    for device in ("cpu", torch.device("cpu"), "meta"):
        kernels = select_kernels(device)
        assert isinstance(kernels, Kernels)
        assert kernels == reference_kernels()
        assert kernels.paged_decode_attention is reference.paged_decode_attention


def test_select_kernels_picks_triton_for_cuda():
    pytest.importorskip("triton")
    kernels = select_kernels("cuda:0")  # choosing imports the kernels; it launches nothing
    assert kernels.name == "triton"
    assert kernels.store_kv.__module__ == "workers.kernels.store_kv"
    assert kernels.paged_prefill_attention.__module__ == "workers.kernels.prefill_attention"

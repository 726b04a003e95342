"""The Triton kernels on CUDA against the torch reference (run on the same device)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.unit.workers.kernels.paged_cases import (
    DECODE_CASES,
    PREFILL_CASES,
    STORE_CASES,
    TOLERANCE,
    Case,
    PagedInputs,
    build,
    store_cache_blocks,
    store_inputs,
)
from workers.kernels import reference
from workers.kernels.dispatch import select_kernels

pytestmark = pytest.mark.gpu

# Larger shapes than the interpreter can afford: long contexts, head_dim 128, GQA 4 (Llama-3-8B-like).
BIG_DECODE = (
    Case("fp16", 16, 128, 8, 4, (1, 100, 1000, 4096), tile=64),
    Case("bf16", 16, 128, 8, 4, (4096, 17, 2049), tile=64),
    Case("bf16", 32, 64, 3, 3, (513, 1024), tile=64),
)
BIG_PREFILL = (
    Case("fp16", 16, 128, 8, 4, (1000, 300), q_lens=(1000, 77), tile=64, block_m=64),
    Case("bf16", 16, 64, 3, 3, (2048, 600, 5), q_lens=(512, 600, 1), tile=64, block_m=64),
)
# fp16/bf16 dots run natively on the GPU (P rounded to the input dtype before P@V): looser than the CPU.
GPU_TOLERANCE = {**TOLERANCE, "fp16": 1e-2, "bf16": 5e-2}


def _cuda(x: PagedInputs) -> PagedInputs:
    moved = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    for name, value in moved.items():
        if isinstance(value, torch.Tensor):
            moved[name] = value.cuda()
    return PagedInputs(**moved)


def test_dispatch_selects_triton_on_cuda():
    assert select_kernels("cuda").name == "triton"


@pytest.mark.parametrize("case", DECODE_CASES + BIG_DECODE, ids=lambda c: c.id)
@pytest.mark.parametrize("default_tiles", [True, False], ids=["default-tile", "case-tile"])
def test_decode_matches_reference(case, default_tiles):
    from workers.kernels.decode_attention import paged_decode_attention

    x = _cuda(build(case))
    args = (x.q, x.k_cache, x.v_cache, x.block_tables, x.context_lens, x.scale)
    got = paged_decode_attention(*args) if default_tiles else paged_decode_attention(*args, tile=case.tile)
    want = reference.paged_decode_attention(*args)
    torch.testing.assert_close(got.float(), want.float(), atol=GPU_TOLERANCE[case.dtype], rtol=0)


@pytest.mark.parametrize("case", PREFILL_CASES + BIG_PREFILL, ids=lambda c: c.id)
@pytest.mark.parametrize("default_tiles", [True, False], ids=["default-tile", "case-tile"])
def test_prefill_matches_reference(case, default_tiles):
    from workers.kernels.prefill_attention import paged_prefill_attention

    x = _cuda(build(case))
    args = (x.q, x.k_cache, x.v_cache, x.block_tables, x.cu_seqlens_q, x.context_lens, x.scale)
    if default_tiles:
        got = paged_prefill_attention(*args)
    else:
        got = paged_prefill_attention(*args, block_m=case.block_m, block_n=case.tile)
    want = reference.paged_prefill_attention(*args)
    torch.testing.assert_close(got.float(), want.float(), atol=GPU_TOLERANCE[case.dtype], rtol=0)


@pytest.mark.parametrize("case", STORE_CASES, ids=lambda c: c.id)
def test_store_kv_matches_reference(case):
    from workers.kernels.store_kv import store_kv

    k, v, slots = (t.cuda() for t in store_inputs(case))
    shape = (store_cache_blocks(case), case.block_size, case.num_kv_heads, case.head_dim)
    caches = [torch.randn(shape, device="cuda").to(k.dtype) for _ in range(2)]
    want = [c.clone() for c in caches]
    store_kv(k, v, caches[0], caches[1], slots)
    reference.store_kv(k, v, want[0], want[1], slots)
    assert torch.equal(caches[0], want[0])
    assert torch.equal(caches[1], want[1])

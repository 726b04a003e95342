"""Runs Triton kernels' case grids under ``TRITON_INTERPRET=1`` and prints the errors as JSON.

Usage: ``python -m tests.unit.workers.kernels.interp_runner {store,decode,prefill}...``.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a kernel, i.e. when the kernel module
is first imported, and the choice then sticks for the life of the process. The tests therefore run this
module in a child process with the variable set, so the pytest process never holds interpreted kernels.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import json
import traceback
from collections.abc import Callable

import torch

from tests.unit.workers.kernels.paged_cases import (
    DECODE_CASES,
    PREFILL_CASES,
    STORE_CASES,
    Case,
    build,
    store_cache_blocks,
    store_inputs,
)
from workers.kernels import reference


def _decode_err(case: Case) -> float:
    from workers.kernels.decode_attention import paged_decode_attention

    x = build(case)
    args = (x.q, x.k_cache, x.v_cache, x.block_tables, x.context_lens, x.scale)
    got = paged_decode_attention(*args, tile=case.tile)
    return float((got.float() - reference.paged_decode_attention(*args).float()).abs().max())


def _prefill_err(case: Case) -> float:
    from workers.kernels.prefill_attention import paged_prefill_attention

    x = build(case)
    args = (x.q, x.k_cache, x.v_cache, x.block_tables, x.cu_seqlens_q, x.context_lens, x.scale)
    got = paged_prefill_attention(*args, block_m=case.block_m, block_n=case.tile)
    want = reference.paged_prefill_attention(*args)
    return float((got.float() - want.float()).abs().max()) if got.numel() else 0.0


def _store_err(case: Case) -> float:
    from workers.kernels.store_kv import store_kv

    k, v, slots = store_inputs(case)
    shape = (store_cache_blocks(case), case.block_size, case.num_kv_heads, case.head_dim)
    caches = [torch.randn(shape).to(k.dtype) for _ in range(2)]
    want = [c.clone() for c in caches]
    store_kv(k, v, caches[0], caches[1], slots)
    reference.store_kv(k, v, want[0], want[1], slots)
    return max(float((got.float() - w.float()).abs().max()) for got, w in zip(caches, want, strict=True))


RUNNERS: dict[str, tuple[tuple[Case, ...], Callable[[Case], float]]] = {
    "decode": (DECODE_CASES, _decode_err),
    "prefill": (PREFILL_CASES, _prefill_err),
    "store": (STORE_CASES, _store_err),
}
KERNEL_MODULES = {"decode": "decode_attention", "prefill": "prefill_attention", "store": "store_kv"}


def run_grid(kernel: str) -> tuple[bool, dict[str, dict[str, float | str]]]:
    """``(kernels were interpreted, {case id: {"err": max abs error} or {"error": traceback}})``."""
    cases, measure = RUNNERS[kernel]
    results: dict[str, dict[str, float | str]] = {}
    for case in cases:
        try:
            results[case.id] = {"err": measure(case)}
        except Exception:  # reported to the parent test, which fails on it
            results[case.id] = {"error": traceback.format_exc(limit=4)}
    module = sys.modules[f"workers.kernels.{KERNEL_MODULES[kernel]}"]
    kernels = [obj for name, obj in vars(module).items() if name.endswith("_kernel")]
    interpreted = bool(kernels) and all(type(k).__name__ == "InterpretedFunction" for k in kernels)
    return interpreted, results


def main(kernels: list[str]) -> int:
    report: dict[str, dict[str, object]] = {"interpreted": {}, "results": {}}
    for kernel in kernels:
        report["interpreted"][kernel], report["results"][kernel] = run_grid(kernel)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

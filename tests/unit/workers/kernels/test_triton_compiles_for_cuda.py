"""The Triton kernels compile for an H100/H200 (sm_90) down to a cubin, with no GPU present.

This catches what the CPU interpreter cannot: code the GPU compiler rejects (types, layouts, constexpr
branches) and shared-memory use. Numerical checks on a real device live in ``tests/gpu``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytestmark = pytest.mark.skipif("TRITON_INTERPRET" in os.environ, reason="TRITON_INTERPRET set by the caller")

INT32_POINTERS = {"tables_ptr", "lens_ptr", "cu_q_ptr"}
H200_SHARED_BYTES = 228 * 1024


def _compile(fn: Any, dtype: str, constexprs: dict[str, Any]) -> Any:
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name == "slot_ptr":
            signature[name] = "*i64"
        elif name in INT32_POINTERS:
            signature[name] = "*i32"
        elif name.endswith("_ptr"):
            signature[name] = f"*{dtype}"
        else:
            signature[name] = "fp32" if name == "qk_scale" else "i32"
    source = ASTSource(
        fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    )
    return triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": True})


@pytest.fixture
def triton_cache(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_decode_kernel_compiles(triton_cache, dtype):
    from workers.kernels.decode_attention import _decode_kernel

    constexprs = {"GROUP": 4, "GROUP_P": 16, "HEAD_DIM": 128, "D_P": 128, "BLOCK_SIZE": 16, "TILE": 64}
    kernel = _compile(_decode_kernel, dtype, {**constexprs, "UPCAST": False})
    assert "cubin" in kernel.asm
    assert kernel.metadata.shared <= H200_SHARED_BYTES


def test_prefill_kernel_compiles(triton_cache):
    from workers.kernels.prefill_attention import _prefill_kernel

    constexprs = {"GROUP": 3, "HEAD_DIM": 64, "D_P": 64, "BLOCK_SIZE": 16, "BLOCK_M": 64, "BLOCK_N": 64}
    kernel = _compile(_prefill_kernel, "fp16", {**constexprs, "UPCAST": False})
    assert "cubin" in kernel.asm
    assert kernel.metadata.shared <= H200_SHARED_BYTES


def test_store_kv_kernel_compiles(triton_cache):
    from workers.kernels.store_kv import _store_kv_kernel

    kernel = _compile(_store_kv_kernel, "bf16", {"ROW": 3 * 64, "ROW_P": 256})
    assert "cubin" in kernel.asm

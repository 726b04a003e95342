"""``python -m loadtest.bench_kernels`` runs on CPU (the torch reference) and prints a bandwidth line."""

from __future__ import annotations

import re

import pytest
import torch

from loadtest import bench_kernels


def test_bench_runs_the_reference_on_cpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the bench would time the GPU shapes")
    assert (
        bench_kernels.main(["--batch", "2", "--context", "40", "--iters", "2", "--dtypes", "fp32,bf16"]) == 0
    )
    out = capsys.readouterr().out
    assert "torch reference on CPU" in out
    lines = [line for line in out.splitlines() if line.strip().startswith("torch-reference")]
    assert len(lines) == 2
    assert all(re.search(r"batch=2 ctx=40 .* ms/call .* GB/s", line) for line in lines)


def test_kv_bytes_counts_k_and_v_of_every_sequence():
    shape = bench_kernels.Shape(batch=64, context=4096, heads=32, kv_heads=8, head_dim=128, block_size=16)
    assert shape.kv_bytes(torch.float16) == 2 * 64 * 4096 * 8 * 128 * 2

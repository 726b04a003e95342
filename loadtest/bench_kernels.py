"""Decode-attention kernel bandwidth: ``python -m loadtest.bench_kernels``.

Decode attention is memory bound: every step reads each sequence's whole K and V. The figure of merit is
the achieved bandwidth, ``bytes of K/V read / time per call``, against the device's peak (``--peak-gbps``;
4800 GB/s is an H200's HBM3e).

- On CUDA it times the Triton kernel (the one ``select_kernels`` picks there) at batch 64, context 4096,
  32 query heads / 8 KV heads, head_dim 128, in fp16 and bf16, with CUDA events.
- Without CUDA it times the torch reference (the CPU path) at SmolLM2-135M's attention shapes (batch 8,
  context 1024, 9 / 3 heads, head_dim 64, fp32) and says so; the CPU figure includes the reference's
  gather copy and has no meaningful peak.

Block tables are a random permutation of the pool, so reads are as scattered as in a long-running engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from workers.kernels.dispatch import Kernels, select_kernels

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    batch: int
    context: int
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int

    def kv_bytes(self, dtype: torch.dtype) -> int:
        """K and V bytes one decode call reads."""
        return 2 * self.batch * self.context * self.kv_heads * self.head_dim * dtype.itemsize


GPU_SHAPE = Shape(batch=64, context=4096, heads=32, kv_heads=8, head_dim=128, block_size=16)
CPU_SHAPE = Shape(batch=8, context=1024, heads=9, kv_heads=3, head_dim=64, block_size=16)


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    kernels: str
    device: str
    dtype: str
    shape: Shape
    seconds: float  # median per call
    best: float  # fastest call (a better guide than the median on a shared, noisy CPU)

    @property
    def gb_per_s(self) -> float:
        return self.shape.kv_bytes(DTYPES[self.dtype]) / self.seconds / 1e9


def _inputs(shape: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=device).manual_seed(0)
    per_seq = -(-shape.context // shape.block_size)
    num_blocks = shape.batch * per_seq
    cache_shape = (num_blocks, shape.block_size, shape.kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(cache_shape, generator=gen, device=device, dtype=dtype)
    perm = torch.randperm(num_blocks, generator=gen, device=device)
    tables = perm.view(shape.batch, per_seq).to(torch.int32)
    lens = torch.full((shape.batch,), shape.context, dtype=torch.int32, device=device)
    q = torch.randn(shape.batch, shape.heads, shape.head_dim, generator=gen, device=device, dtype=dtype)
    return q, k_cache, v_cache, tables, lens


def _time_calls(call: Callable[[], object], device: torch.device, iters: int) -> list[float]:
    """Seconds per call, ``iters`` samples after two warm-up calls."""
    call()
    call()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            call()
            end.record()
            end.synchronize()
            samples.append(float(start.elapsed_time(end)) / 1e3)
        else:
            begin = time.perf_counter()
            call()
            samples.append(time.perf_counter() - begin)
    return samples


def bench_decode(kernels: Kernels, shape: Shape, dtype: str, device: torch.device, iters: int) -> Result:
    """Time ``kernels.paged_decode_attention`` at ``shape``."""
    q, k_cache, v_cache, tables, lens = _inputs(shape, DTYPES[dtype], device)
    scale = shape.head_dim**-0.5

    def call() -> object:
        return kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)

    samples = _time_calls(call, device, iters)
    return Result(kernels.name, str(device), dtype, shape, statistics.median(samples), min(samples))


def _format(result: Result, peak_gbps: float | None) -> str:
    s = result.shape
    share = (
        f"{100 * result.gb_per_s / peak_gbps:5.1f}% of {peak_gbps:.0f} GB/s peak" if peak_gbps else "peak n/a"
    )
    return (
        f"{result.kernels:>15} {result.device:>6} {result.dtype} batch={s.batch} ctx={s.context} "
        f"heads={s.heads}/{s.kv_heads} d={s.head_dim} bs={s.block_size}: "
        f"{result.seconds * 1e3:8.3f} ms/call (best {result.best * 1e3:.3f})  "
        f"{result.gb_per_s:8.1f} GB/s  ({share})"
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_kernels", description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtypes", default=None, help="comma-separated: fp32,fp16,bf16")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (CPU only)")
    p.add_argument("--peak-gbps", type=float, default=4800.0, help="device peak memory bandwidth (GPU only)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = device.type == "cuda"
    shape = GPU_SHAPE if on_gpu else CPU_SHAPE
    overrides = {k: v for k, v in (("batch", args.batch), ("context", args.context)) if v is not None}
    shape = dataclasses.replace(shape, **overrides)
    dtypes = (args.dtypes or ("fp16,bf16" if on_gpu else "fp32")).split(",")
    kernels = select_kernels(device)
    if not on_gpu:
        if args.threads:
            torch.set_num_threads(args.threads)
        threads = torch.get_num_threads()
        print(f"no CUDA device: timing the torch reference on CPU ({threads} threads) at small shapes")
    for dtype in dtypes:
        result = bench_decode(kernels, shape, dtype, device, args.iters)
        print(_format(result, args.peak_gbps if on_gpu else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

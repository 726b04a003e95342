"""Read bandwidth of the KV tiers for realistic block sizes: ``python -m loadtest.bench_tier``.

Blocks have SmolLM2-135M's geometry (30 layers, 3 KV heads, head dim 64, 16 tokens per block): 720 KiB
per block in fp32, 360 KiB in bf16. For each dtype and batch size (1, 16, 64 blocks) it times
``get_many`` on the Redis tier and on the SSD tier (checksums verified, as in production) and prints
MB/s; ``--codec`` adds the host-side cost of turning values into cache blocks and back. Without
``--redis-url`` it starts its own ``redis-server`` on a free loopback port and stops it by PID. SSD reads
come from the page cache when the files were just written (this bench cannot drop caches): read them as
the file-system path's ceiling, not the device's. Figures from a shared, loaded machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate_core.kvcontract.wire import BlockLayout, BlockMeta, pack_block
from workers.kvtier.protocols import WritableTier
from workers.kvtier.redis_tier import RedisTier, RedisTierConfig
from workers.kvtier.ssd_tier import SsdTier, SsdTierConfig

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 30, 3, 64, 16


@dataclass(frozen=True, slots=True)
class Cell:
    tier: str
    dtype: str
    batch: int
    value_bytes: int
    seconds_per_batch: float

    @property
    def mb_per_s(self) -> float:
        return self.batch * self.value_bytes / self.seconds_per_batch / 1e6


def layout(dtype: str) -> BlockLayout:
    return BlockLayout(LAYERS, BLOCK, dtype, (LAYERS, 2, BLOCK, KV_HEADS, HEAD_DIM))


def make_blocks(dtype: str, count: int, base: int) -> list[tuple[int, bytes]]:
    lay = layout(dtype)
    pattern = bytes(range(256)) * (lay.payload_bytes // 256 + 1)
    return [
        (
            base + i,
            pack_block(BlockMeta.of(MODEL, base + i, lay), pattern[i % 256 : i % 256 + lay.payload_bytes]),
        )
        for i in range(count)
    ]


async def time_reads(tier: WritableTier, hashes: Sequence[int], batch: int, budget_s: float) -> float:
    """Mean seconds per ``get_many`` of ``batch`` blocks, cycling over ``hashes`` for about ``budget_s``."""
    reps, elapsed, i = 0, 0.0, 0
    while reps < 3 or (elapsed < budget_s and reps < 500):
        chunk = [hashes[(i + k) % len(hashes)] for k in range(batch)]
        i += batch
        t0 = time.perf_counter()
        values = await tier.get_many(chunk)
        elapsed += time.perf_counter() - t0
        if any(v is None for v in values):
            raise RuntimeError("bench blocks went missing: is the Redis maxmemory too small?")
        reps += 1
    return elapsed / reps


async def bench_tier(
    name: str, tier: WritableTier, dtype: str, batches: Sequence[int], budget_s: float
) -> list[Cell]:
    blocks = make_blocks(dtype, max(batches) * 2, base=1 << 40)
    for i in range(0, len(blocks), 16):
        await tier.put_many(blocks[i : i + 16])
    hashes = [h for h, _ in blocks]
    size = len(blocks[0][1])
    return [Cell(name, dtype, b, size, await time_reads(tier, hashes, b, budget_s)) for b in batches]


@contextlib.contextmanager
def own_redis() -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed; pass --redis-url or install it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", port))
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


async def run_all(redis_url: str, ssd_dir: Path, args: argparse.Namespace) -> list[Cell]:
    cells: list[Cell] = []
    for dtype in args.dtype:
        redis = RedisTier(RedisTierConfig(redis_url, MODEL, layout=layout(dtype), timeout_s=10.0))
        cells += await bench_tier("redis", redis, dtype, args.batch, args.budget_s)
        await redis.aclose()
        ssd_cfg = SsdTierConfig(
            ssd_dir, MODEL, capacity_bytes=4 << 30, layout=layout(dtype), io_threads=args.io_threads
        )
        ssd = await SsdTier.open(ssd_cfg)
        cells += await bench_tier("ssd", ssd, dtype, args.batch, args.budget_s)
        await ssd.aclose()
        if args.codec:
            cells += bench_codec(dtype, max(args.batch), args.budget_s, args.torch_threads)
    return cells


def bench_codec(dtype: str, batch: int, budget_s: float, threads: int | None) -> list[Cell]:
    """Host-side cost of ``BlockCodec.dump``/``load`` (CPU tensors): the rest of a pull besides the read."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)

    from workers.kvtier.codec import BlockCodec, KVGeometry

    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    shape = (batch * 2, BLOCK, KV_HEADS, HEAD_DIM)
    caches = [(torch.randn(shape).to(tdtype), torch.randn(shape).to(tdtype)) for _ in range(LAYERS)]
    codec = BlockCodec(MODEL, KVGeometry.of(caches))
    ids, hashes = list(range(batch)), list(range(1, batch + 1))
    values = codec.dump(caches, ids, hashes)
    cells = []
    for name, op in (
        ("codec.dump", lambda: codec.dump(caches, ids, hashes)),
        ("codec.load", lambda: codec.load(caches, values, hashes, [batch + i for i in ids])),
    ):
        reps, t0 = 0, time.perf_counter()
        while reps < 3 or (time.perf_counter() - t0 < budget_s and reps < 200):
            op()
            reps += 1
        cells.append(Cell(name, dtype, batch, codec.value_bytes, (time.perf_counter() - t0) / reps))
    return cells


def report(cells: Sequence[Cell]) -> str:
    lines = [
        "| tier | dtype | block KiB | batch | ms/batch | MB/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {c.tier} | {c.dtype} | {c.value_bytes / 1024:.1f} | {c.batch} | {c.seconds_per_batch * 1e3:.2f} "
        f"| {c.mb_per_s:.0f} |"
        for c in cells
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_tier", description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", help="an existing Redis (default: start a private redis-server)")
    parser.add_argument("--ssd-dir", type=Path, help="SSD tier directory (default: a temporary directory)")
    parser.add_argument(
        "--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"]
    )
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--budget-s", type=float, default=1.0, help="timed seconds per cell")
    parser.add_argument("--io-threads", type=int, default=8)
    parser.add_argument("--codec", action="store_true", help="also time codec dump/load (imports torch)")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch intra-op threads for --codec")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        url = args.redis_url or stack.enter_context(own_redis())
        ssd_dir = args.ssd_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvgate-ssd-")))
        cells = asyncio.run(run_all(url, ssd_dir, args))
    print(report(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

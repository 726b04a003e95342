"""Micro-benchmark of KV index lookups: µs per ``longest_prefix`` for long prompts over many workers.

Run: ``.venv/bin/python -m loadtest.bench_index [--workers 16] [--blocks 512] [--iters 3000]``
(512 blocks of 16 tokens = an 8k-token prompt). Prints mean and p50/p99 per scenario; figures are CPU time
on this machine, single process.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence

from gateway.kvindex.approximate import ApproximateKVIndex
from gateway.kvindex.memory import MemoryIndexConfig, MemoryKVIndex
from kvgate_core.kvcontract.events import EventType, KVEvent, Tier


def _stored(worker: str, hashes: Sequence[int], tier: Tier = Tier.GPU) -> KVEvent:
    return KVEvent(worker=worker, type=EventType.STORED, tier=tier, hashes=tuple(hashes))


def _timed(fn: Callable[[], object], iters: int) -> tuple[float, float, float]:
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    return statistics.fmean(samples), samples[len(samples) // 2], samples[int(len(samples) * 0.99)]


def _populated(workers: list[str], blocks: int, background: int, rng: random.Random) -> MemoryKVIndex:
    index = MemoryKVIndex(MemoryIndexConfig(max_blocks=background + 100 * blocks))
    for worker in workers:  # unrelated blocks so the dicts have a realistic size
        index.apply(_stored(worker, [rng.getrandbits(64) for _ in range(background // len(workers))]))
    return index


def run(
    num_workers: int, num_blocks: int, iters: int, background: int
) -> list[tuple[str, float, float, float]]:
    rng = random.Random(0)
    workers = [f"w{i}" for i in range(num_workers)]
    prompt = [rng.getrandbits(64) for _ in range(num_blocks)]
    index = _populated(workers, num_blocks, background, rng)
    rows = []
    rows.append(
        ("miss (no worker holds block 0)", *_timed(lambda: index.longest_prefix(prompt, workers), iters))
    )
    for i, worker in enumerate(workers):  # worker i holds a leading prefix of i/num_workers of the prompt
        index.apply(_stored(worker, prompt[: num_blocks * i // num_workers]))
    index.apply(_stored(workers[-1], prompt))
    rows.append(
        ("staggered prefixes, one full hit", *_timed(lambda: index.longest_prefix(prompt, workers), iters))
    )
    index.record_routed(workers[0], prompt)
    pred = _timed(lambda: index.longest_prefix(prompt, workers), min(iters, 1_000))
    rows.append(("same + live predictions", *pred))
    tiered = MemoryKVIndex()
    tiered.apply(_stored(workers[0], prompt[: num_blocks // 4]))
    tiered.apply(_stored("tier", prompt, Tier.DRAM))
    rows.append(("gpu quarter + dram rest", *_timed(lambda: tiered.longest_prefix(prompt, workers), iters)))
    approx = ApproximateKVIndex()
    for worker in workers:
        approx.record_routed(worker, prompt[: num_blocks // 2])
    rows.append(
        ("approximate, all half hits", *_timed(lambda: approx.longest_prefix(prompt, workers), iters))
    )
    events = [_stored(workers[i % num_workers], prompt[:64]) for i in range(iters)]
    it = iter(events)
    rows.append(("apply one 64-block stored event", *_timed(lambda: index.apply(next(it)), iters)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--iters", type=int, default=3_000)
    parser.add_argument("--background", type=int, default=200_000, help="unrelated blocks in the index")
    args = parser.parse_args()
    rows = run(args.workers, args.blocks, args.iters, args.background)
    print(f"workers={args.workers} blocks/prompt={args.blocks} background blocks={args.background}")
    print(f"{'scenario':40s} {'mean µs':>9s} {'p50 µs':>9s} {'p99 µs':>9s}")
    for name, mean, p50, p99 in rows:
        print(f"{name:40s} {mean:9.1f} {p50:9.1f} {p99:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

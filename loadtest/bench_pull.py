"""TTFT of a shared prefix on a second worker: pulled from the shared tier vs recomputed (real engine, CPU).

In one process: worker A (``--kv-tier``) prefills the prompt with ``max_tokens: 1`` and pushes its blocks;
worker B (same tier) then serves the same prompt and pulls them; worker C (no tier) computes it from
scratch. Each figure is the median over ``--repeats`` fresh B/C engines (an engine's own prefix cache
would otherwise serve the repeats). The tier is a private ``redis-server`` (and optionally an SSD dir).

Run: ``python -m loadtest.bench_pull --model smollm2 --prefix-tokens 1024 --repeats 3``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import tempfile
import time
from pathlib import Path

from loadtest.bench_pd import redis_tier
from workers.engine.engine import TorchEngine
from workers.engine.serve import EngineOptions, build_engine_from_options
from workers.engine_api import GenerationRequest, SamplingParams


async def _ttft(options: EngineOptions, prompt: tuple[int, ...], max_tokens: int) -> tuple[float, int, int]:
    """(seconds to the first chunk, cached prompt tokens, blocks pulled) on a fresh engine."""
    engine: TorchEngine = build_engine_from_options(options)
    await engine.start()
    try:
        request = GenerationRequest(
            "bench", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), model=engine.model_id
        )
        t0 = time.perf_counter()
        stream = engine.generate(request)
        first = await anext(stream)
        ttft = time.perf_counter() - t0
        last = first
        async for chunk in stream:
            last = chunk
        pulled = engine.connector.pulled_blocks if engine.connector is not None else 0
        return ttft, last.num_cached_tokens, pulled
    finally:
        await engine.stop()


async def run(args: argparse.Namespace, tier: str, ssd: str | None) -> dict[str, float]:
    base = EngineOptions(
        model=args.model, kv_tokens=args.prefix_tokens * 4, device="cpu", cpu_threads=args.threads
    )
    with_tier = dataclasses.replace(base, kv_tier=tier, ssd_dir=ssd)
    rng = random.Random(0)
    probe = build_engine_from_options(base)
    vocab = probe.core.runner.model.config.vocab_size
    del probe
    prompt = tuple(rng.randrange(100, vocab) for _ in range(args.prefix_tokens))
    await _ttft(dataclasses.replace(with_tier, worker_id="prefill"), prompt, 1)  # pushes
    pulled, recomputed, cached = [], [], 0
    for _ in range(args.repeats):
        t, cached, blocks = await _ttft(with_tier, prompt, 2)
        pulled.append(t)
        if blocks == 0:
            raise SystemExit("the second worker pulled nothing: is the tier reachable?")
        t, _, _ = await _ttft(base, prompt, 2)
        recomputed.append(t)
    return {
        "pulled_ttft_s": statistics.median(pulled),
        "recomputed_ttft_s": statistics.median(recomputed),
        "cached_tokens": float(cached),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny | smollm2 | a model path")
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per engine")
    p.add_argument("--ssd", action="store_true", help="add an SSD tier directory (layered tier)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, redis_tier(Path(tmp)) as tier:
        result = asyncio.run(run(args, tier, str(Path(tmp) / "ssd") if args.ssd else None))
    pulled, recomputed = result["pulled_ttft_s"] * 1000, result["recomputed_ttft_s"] * 1000
    print(
        f"model={args.model} prefix={args.prefix_tokens} tokens: TTFT pulled {pulled:.0f} ms "
        f"(cached_tokens {result['cached_tokens']:.0f}), recomputed {recomputed:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

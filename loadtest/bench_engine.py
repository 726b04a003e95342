"""Engine micro-benchmark: prefill and decode tokens/s at batch 1 and 8, and time to first token for a
long prompt with and without a prefix-cache hit. Drives ``EngineCore`` directly (no HTTP).

Run: ``python -m loadtest.bench_engine [--model smollm2] [--device cpu]``. Prompts are random token ids
(outside the special-token range), generation is greedy with EOS ignored, so every run does the same work.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workers.engine.core import EngineCore
from workers.engine.serve import EngineOptions, build_engine_from_options
from workers.engine_api import GenerationRequest, SamplingParams


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds from submission to the first token of the last sequence, and to the end of all of them."""

    first_token_s: float
    total_s: float


def _run(core: EngineCore, prompts: Sequence[Sequence[int]], max_tokens: int, tag: str) -> Timing:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        core.submit(GenerationRequest(f"{tag}-{i}", tuple(prompt), params, model="bench"))
    started: set[str] = set()
    first = 0.0
    while core.has_work:
        for request_id, _ in core.step().chunks:
            if request_id not in started:
                started.add(request_id)
                first = time.perf_counter() - start
    return Timing(first, time.perf_counter() - start)


def _prompts(rng: random.Random, count: int, length: int, vocab: int) -> list[list[int]]:
    low = min(1000, vocab // 2)
    return [[rng.randrange(low, vocab) for _ in range(length)] for _ in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt length of the batch runs")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--long-prompt", type=int, default=1024, help="prompt length of the TTFT runs")
    parser.add_argument("--chunk", type=int, default=1024, help="tokens computed per step (prefill chunk)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: half the cores)"
    )
    args = parser.parse_args(argv)
    options = EngineOptions(
        model=args.model,
        device=args.device,
        kv_tokens=32768,
        max_batched_tokens=args.chunk,
        cpu_threads=args.threads,
    )
    engine = build_engine_from_options(options)
    core, vocab = engine.core, engine.bundle.tokenizer.vocab_size
    rng = random.Random(0)
    _run(core, _prompts(rng, 1, 32, vocab), 2, "warmup")
    threads = torch.get_num_threads()
    print(f"model {engine.model_id}, {args.device} ({threads} threads), prefill chunk {args.chunk} tokens")
    for batch in (1, 8):
        prompts = _prompts(rng, batch, args.prompt_tokens, vocab)
        prefill = _run(core, prompts, 1, f"p{batch}")
        decode = _run(core, _prompts(rng, batch, 16, vocab), args.decode_tokens, f"d{batch}")
        decode_s = decode.total_s - decode.first_token_s
        print(
            f"batch {batch}: prefill {batch * args.prompt_tokens / prefill.total_s:8.1f} tok/s "
            f"({batch}x{args.prompt_tokens} tokens in {prefill.total_s:.2f} s); "
            f"decode {batch * (args.decode_tokens - 1) / decode_s:8.1f} tok/s "
            f"({batch}x{args.decode_tokens - 1} tokens in {decode_s:.2f} s)"
        )
    long_prompt = _prompts(rng, 1, args.long_prompt, vocab)[0]
    cold = _run(core, [long_prompt], 1, "cold")
    warm = _run(core, [[*long_prompt[:-8], *_prompts(rng, 1, 8, vocab)[0]]], 1, "warm")
    print(f"TTFT {args.long_prompt}-token prompt: no prefix hit {cold.first_token_s * 1000:.0f} ms, "
          f"prefix hit (all but the last 8 tokens) {warm.first_token_s * 1000:.0f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

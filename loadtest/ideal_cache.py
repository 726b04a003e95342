"""The ideal fleet hit rate: a request sequence replayed offline through ONE cache of the fleet's capacity.

A router can at best make a fleet of N caches behave like one cache of their summed size, so this replay
is the bar ``bench_routing`` holds the measured hit rate against. It uses the engines' own block manager
(``workers.engine.block_manager``: the LRU the simulated worker runs), one request at a time: allocate the
prompt (cached leading blocks are hits, capped so one prompt token is left to compute, like the engine),
grow it by its output tokens, register the prompt's blocks, free it. Prompts are hashed with the KV
contract over the token ids the gateway and the workers see (``prompt_blocks``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvgate_core.kvcontract.hashing import DEFAULT_BLOCK_SIZE, chain_hashes, root_hash
from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.request_prompt import Endpoint, parse_prompt
from workers.engine.block_manager import BlockManager


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """One request as the cache sees it: prompt length, full-block hashes and output length."""

    num_tokens: int
    block_hashes: tuple[int, ...]
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class IdealResult:
    """Totals of an offline replay; ``hit_rate`` is hit / prompt tokens."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    skipped: int  # requests larger than the whole cache (counted as misses)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else float("nan")


def ideal_replay(
    prompts: Iterable[PromptBlocks], capacity_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE
) -> IdealResult:
    """Replay ``prompts`` in order through one LRU prefix cache of ``capacity_tokens`` tokens.

    Raises:
        ValueError: the capacity holds less than one block, or a prompt's hashes do not match its length.
    """
    if capacity_tokens < block_size:
        raise ValueError(f"capacity_tokens ({capacity_tokens}) must hold at least one block of {block_size}")
    cache = BlockManager(capacity_tokens // block_size, block_size)
    requests = prompt_tokens = hit_tokens = skipped = 0
    for i, p in enumerate(prompts):
        if p.num_tokens < 1:
            continue
        requests += 1
        prompt_tokens += p.num_tokens
        if cache.blocks_for(p.num_tokens + p.output_tokens) > cache.num_total_blocks:
            skipped += 1
            continue
        seq = f"r{i}"
        hit = cache.allocate(seq, p.num_tokens, p.block_hashes, root=0)
        cache.append_slots(seq, p.num_tokens + p.output_tokens)
        cache.commit(seq, range(p.num_tokens))  # hashes are known: the token values are not read
        cache.free(seq)
        hit_tokens += hit * block_size
    return IdealResult(requests, prompt_tokens, hit_tokens, skipped)


def prompt_blocks(
    body: Mapping[str, Any],
    endpoint: Endpoint,
    bundle: TokenizerBundle,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    output_tokens: int | None = None,
) -> PromptBlocks:
    """The request's token ids as the engine sees them (template rendered, tokenized) and their hashes.

    Token-id prompts given as a numpy array (``loadtest.trace``) are used as they are.

    Args:
        body: an OpenAI body (``messages`` for chat, ``prompt`` for completions).
        endpoint: which API the body is for.
        bundle: the workers' tokenizer and chat template.
        block_size: tokens per block.
        output_tokens: tokens the request generated; the body's ``max_tokens`` when None.
    """
    prompt = body.get("prompt")
    tokens: Sequence[int] | np.ndarray
    if endpoint is Endpoint.COMPLETIONS and isinstance(prompt, np.ndarray):
        tokens = prompt.astype(np.uint32, copy=False)  # trace replay: token ids as the driver sends them
    else:
        tokens = bundle.encode(parse_prompt(body, endpoint))
    root = root_hash(str(body.get("model", "")), ())
    out = int(body.get("max_tokens") or 0) if output_tokens is None else output_tokens
    return PromptBlocks(len(tokens), tuple(chain_hashes(tokens, root, block_size)), out)

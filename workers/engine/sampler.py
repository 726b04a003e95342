"""Token sampling: greedy, temperature, top-k and top-p, with a per-request ``torch.Generator``.

Greedy rows take the argmax on the logits' device; sampled rows are drawn on the CPU from their own
generator, so a seeded request gives the same tokens on any device and in any batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workers.engine_api import SamplingParams


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> list[int]:
    """One token id per row of ``logits`` (``[B, vocab]``, fp32), following each row's parameters."""
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    sampled_rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if sampled_rows:
        cpu_logits = logits[sampled_rows].cpu()
        for row, i in enumerate(sampled_rows):
            tokens[i] = _sample_row(cpu_logits[row], params[i], generators[i])
    return tokens


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    scores = logits / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first is always kept).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.empty_like(scores).scatter_(0, order, sorted_scores)
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())

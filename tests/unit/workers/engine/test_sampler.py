"""Sampling: greedy, seeded draws, top-k and top-p filters."""

from __future__ import annotations

import torch

from workers.engine.sampler import sample
from workers.engine_api import SamplingParams


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


LOGITS = torch.tensor([[0.0, 3.0, 1.0, 2.5, -1.0], [5.0, 0.0, 0.0, 0.0, 4.9]])


def test_temperature_zero_is_argmax_per_row() -> None:
    greedy = SamplingParams(temperature=0.0)
    assert sample(LOGITS, [greedy, greedy], [_gen(0), _gen(0)]) == [1, 0]


def test_same_seed_gives_same_draws_and_other_seeds_differ() -> None:
    logits = torch.zeros(1, 1000)
    params = [SamplingParams(temperature=1.0)]

    def draws(seed: int) -> list[int]:
        gen = _gen(seed)
        return [sample(logits, params, [gen])[0] for _ in range(5)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_top_k_keeps_only_the_k_best() -> None:
    params = [SamplingParams(temperature=5.0, top_k=2)]
    gen = _gen(1)
    draws = {sample(LOGITS[:1], params, [gen])[0] for _ in range(200)}
    assert draws == {1, 3}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    # Row 1 has two near-equal leaders (5.0, 4.9) and three far behind: top_p 0.9 keeps only the leaders.
    params = [SamplingParams(temperature=1.0, top_p=0.9)]
    gen = _gen(2)
    draws = {sample(LOGITS[1:], params, [gen])[0] for _ in range(200)}
    assert draws == {0, 4}


def test_tiny_top_p_is_greedy() -> None:
    params = [SamplingParams(temperature=1.0, top_p=1e-6)]
    assert sample(LOGITS, params * 2, [_gen(0), _gen(1)]) == [1, 0]


def test_greedy_and_sampled_rows_mix_in_one_batch() -> None:
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1)]
    assert sample(LOGITS, params, [_gen(0), _gen(0)]) == [1, 0]

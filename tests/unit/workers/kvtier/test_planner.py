"""Pull planner decisions and the rate EWMA."""

from __future__ import annotations

import pytest

from workers.kvtier.planner import PullRates, PullRequest, RateEwma, plan_pull, pullable_blocks

MB = 1_000_000
BLOCK = 368_640 + 80  # SmolLM2 bf16 block + header


def req(prompt_tokens: int = 1024, local: int = 0, tier: int = 64, block_bytes: int = BLOCK) -> PullRequest:
    return PullRequest(prompt_tokens, 16, local, tier, block_bytes)


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (req(prompt_tokens=1024, tier=64), 63),  # all 64 blocks cached: the last one is recomputed
        (req(prompt_tokens=1025, tier=64), 64),  # one token beyond the cached blocks
        (req(prompt_tokens=1024, local=10, tier=20), 20),
        (req(prompt_tokens=1024, local=60, tier=20), 3),
        (req(prompt_tokens=1024, local=64, tier=0), 0),
        (req(prompt_tokens=10, tier=5), 0),
        (req(prompt_tokens=0, tier=5), 0),
    ],
    ids=["full-hit", "one-extra-token", "after-local", "capped-by-prompt", "all-local", "short", "empty"],
)
def test_pullable_blocks_leave_at_least_one_token_to_compute(request_, expected):
    assert pullable_blocks(request_) == expected


@pytest.mark.parametrize(
    ("rates", "expected_blocks", "reason"),
    [
        (PullRates(1000 * MB, 0.001, 2000.0), 63, "pull is faster"),  # fast link, CPU prefill
        (PullRates(1 * MB, 0.001, 2000.0), 0, "recompute is faster"),  # slow link
        (PullRates(1000 * MB, 5.0, 2000.0), 0, "recompute is faster"),  # huge per-batch latency
        (PullRates(1000 * MB, 0.001, 1e9), 0, "recompute is faster"),  # very fast prefill
        (PullRates(0.0, 0.001, 2000.0), 0, "no rate measured"),
    ],
    ids=["fast-link", "slow-link", "high-latency", "fast-prefill", "no-bandwidth"],
)
def test_plan_pulls_only_when_faster(rates, expected_blocks, reason):
    plan = plan_pull(req(), rates)
    assert (plan.num_blocks, plan.reason) == (expected_blocks, reason)
    assert plan.first_block == 0


def test_plan_starts_after_local_hits_and_reports_costs():
    plan = plan_pull(req(local=8, tier=32), PullRates(500 * MB, 0.002, 1000.0))
    assert (plan.first_block, plan.num_blocks) == (8, 32)
    assert plan.pull_s == pytest.approx(0.002 + 32 * BLOCK / (500 * MB))
    assert plan.recompute_s == pytest.approx(32 * 16 / 1000.0)


def test_min_gain_is_hysteresis():
    # pull and recompute cost the same: pull only if the required gain is 1 or less.
    bw = BLOCK * 1000.0 / 16  # one block's bytes per block-of-tokens time
    even = PullRates(bw, 0.0, 1000.0, min_gain=1.0)
    strict = PullRates(bw, 0.0, 1000.0, min_gain=1.5)
    assert plan_pull(req(tier=10), even).num_blocks == 10
    assert plan_pull(req(tier=10), strict).num_blocks == 0


def test_nothing_to_pull_when_tier_has_nothing():
    assert plan_pull(req(tier=0), PullRates(1e12, 0.0, 1.0)).reason == "nothing to pull"


def test_ewma_starts_from_prior_then_first_sample_then_smooths():
    ewma = RateEwma(initial=100.0, alpha=0.5)
    assert (ewma.rate, ewma.num_samples) == (100.0, 0)
    ewma.observe(1000, 1.0)
    assert ewma.rate == 1000.0
    ewma.observe(3000, 1.0)
    assert ewma.rate == 2000.0
    ewma.observe(0, 1.0)
    ewma.observe(10, 0.0)
    assert (ewma.rate, ewma.num_samples) == (2000.0, 2)


@pytest.mark.parametrize(("initial", "alpha"), [(-1.0, 0.5), (1.0, 0.0), (1.0, 1.5)])
def test_ewma_rejects_bad_parameters(initial, alpha):
    with pytest.raises(ValueError, match="must be"):
        RateEwma(initial, alpha)

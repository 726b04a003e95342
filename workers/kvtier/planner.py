"""Pull planner: should a worker pull the next KV blocks from the shared tier or recompute them?

``plan_pull`` is pure: it sees one request's block counts and the rates the worker measured, and answers
how many blocks to pull. Pulling ``n`` blocks costs one batch latency plus ``n * block_bytes /
bandwidth``; recomputing them costs ``n * block_size / prefill rate``. Both grow linearly in ``n``, so the
best answer is all the blocks the tier holds or none: pull them when that is faster by a margin.

The linear prefill cost is a simplification: attention makes late blocks of a long prompt dearer to
compute, which only favours pulling more, so the planner errs towards recomputing.

``RateEwma`` learns a rate (bytes/s of pulls, tokens/s of prefill) from real measurements. It is the one
piece with state; the scheduler owns one per rate and passes its current value to ``plan_pull``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PullRequest:
    """One request as the planner sees it.

    Attributes:
        prompt_tokens: tokens in the prompt.
        block_size: tokens per block.
        local_hit_blocks: leading blocks already in the worker's own cache.
        tier_hit_blocks: blocks present in the tier right after the local hits (``contains_prefix`` of
            the hashes from ``local_hit_blocks`` on).
        block_bytes: bytes of one stored block (``BlockLayout.payload_bytes`` plus its header).
    """

    prompt_tokens: int
    block_size: int
    local_hit_blocks: int
    tier_hit_blocks: int
    block_bytes: int


@dataclass(frozen=True, slots=True)
class PullRates:
    """What the worker measured (or assumes before its first measurement).

    Attributes:
        pull_bytes_per_s: tier read bandwidth.
        pull_latency_s: fixed cost of one batch read (round trip, header checks).
        prefill_tokens_per_s: the engine's prefill throughput.
        min_gain: pull only when recomputing is at least this factor slower (hysteresis against noise).
    """

    pull_bytes_per_s: float
    pull_latency_s: float
    prefill_tokens_per_s: float
    min_gain: float = 1.2


@dataclass(frozen=True, slots=True)
class PullPlan:
    """The decision: pull blocks ``[first_block, first_block + num_blocks)`` (none if ``num_blocks`` is 0)."""

    first_block: int
    num_blocks: int
    pull_s: float
    recompute_s: float
    reason: str


def pullable_blocks(req: PullRequest) -> int:
    """Tier blocks that may be pulled: at least one prompt token must be left to compute (it yields the
    first output token's logits), so a fully cached prompt still recomputes its last block."""
    if req.prompt_tokens <= 0 or req.block_size <= 0:
        return 0
    last_full = (req.prompt_tokens - 1) // req.block_size  # blocks that end before the last token
    return max(0, min(req.tier_hit_blocks, last_full - req.local_hit_blocks))


def plan_pull(req: PullRequest, rates: PullRates) -> PullPlan:
    """Decide how many leading blocks after the local hits to pull from the tier.

    Returns:
        A plan pulling every pullable block when that beats recomputing them by ``rates.min_gain``,
        else a plan pulling nothing; ``reason`` says which rule decided.
    """
    n = pullable_blocks(req)
    first = req.local_hit_blocks
    if n == 0:
        return PullPlan(first, 0, 0.0, 0.0, "nothing to pull")
    if rates.pull_bytes_per_s <= 0 or rates.prefill_tokens_per_s <= 0:
        return PullPlan(first, 0, 0.0, 0.0, "no rate measured")
    pull_s = rates.pull_latency_s + n * req.block_bytes / rates.pull_bytes_per_s
    recompute_s = n * req.block_size / rates.prefill_tokens_per_s
    if recompute_s >= pull_s * rates.min_gain:
        return PullPlan(first, n, pull_s, recompute_s, "pull is faster")
    return PullPlan(first, 0, pull_s, recompute_s, "recompute is faster")


class RateEwma:
    """Exponentially weighted moving average of a rate (amount per second).

    Args:
        initial: the rate assumed before the first observation (a configured prior).
        alpha: weight of each new observation, in (0, 1].
    """

    __slots__ = ("_alpha", "_rate", "_samples")

    def __init__(self, initial: float, alpha: float = 0.2) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if initial < 0:
            raise ValueError("initial rate must be >= 0")
        self._alpha = alpha
        self._rate = initial
        self._samples = 0

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def num_samples(self) -> int:
        return self._samples

    def observe(self, amount: float, seconds: float) -> None:
        """Add one measurement (e.g. bytes pulled and the time it took). Empty or instant ones are ignored."""
        if amount <= 0 or seconds <= 0:
            return
        sample = amount / seconds
        self._rate = sample if self._samples == 0 else self._rate + self._alpha * (sample - self._rate)
        self._samples += 1

"""The approximate index's per-worker units and assumed cache: learned from engine facts, usage and hits."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from gateway.kvindex.approximate import ApproximateIndexConfig, ApproximateKVIndex
from gateway.kvindex.capacity import BYTES_PER_TOKEN, CapacityConfig, CapacityLearner


def learner(
    initial_ratio: float = 1.0, headroom: float = 1.0, **index: int
) -> tuple[CapacityLearner, ApproximateKVIndex]:
    """A learner on an index; no headroom unless asked, so the index keeps exactly the assumed capacity."""
    approx = ApproximateKVIndex(ApproximateIndexConfig(**index), clock=lambda: 0.0)
    config = CapacityConfig(initial_ratio=initial_ratio, headroom=headroom)
    return CapacityLearner(approx, block_size=16, config=config), approx


def finish(
    units: CapacityLearner,
    worker: str = "w",
    *,
    gateway: int = 0,
    engine: int | None = None,
    predicted: int = 0,
    reported: int | None = None,
    approximate: bool = True,
) -> None:
    units.observe(
        worker, gateway_prompt_tokens=gateway, engine_prompt_tokens=engine, predicted_tokens=predicted,
        reported_tokens=reported, tolerance_tokens=16, learn_capacity=approximate,
    )  # fmt: skip


def test_bytes_per_engine_token_is_learned_from_usage() -> None:
    units, _ = learner(BYTES_PER_TOKEN)
    assert units.ratio("w") == BYTES_PER_TOKEN  # the prior, before any usage
    finish(units, gateway=5_500, engine=1_000)
    assert units.ratio("w") == pytest.approx(5.5)  # the first sample replaces the prior
    for _ in range(200):
        finish(units, gateway=6_000, engine=1_000)
    assert units.ratio("w") == pytest.approx(6.0, rel=0.01)
    assert units.engine_tokens("w", 6_000) == pytest.approx(1_000, abs=10)
    assert units.ratio("other") == BYTES_PER_TOKEN  # per worker


def test_the_engines_own_tokenizer_keeps_the_units_equal() -> None:
    units, _ = learner()
    finish(units, gateway=1_020, engine=1_000)  # a chat template a token or two apart
    assert units.ratio("w") == 1.0 and units.engine_tokens("w", 777) == 777
    finish(units, gateway=2_000, engine=1_000)  # really another tokenizer
    assert units.ratio("w") > 1.05


def test_the_engines_capacity_sizes_the_assumed_cache_in_the_gateways_blocks() -> None:
    units, approx = learner(BYTES_PER_TOKEN)
    units.set_engine_capacity("w", 32_000)  # engine tokens
    assert approx.capacity("w") == 32_000 * 4 // 16  # bytes, by the prior
    for _ in range(50):
        finish(units, gateway=5_000, engine=1_000)
    assert approx.capacity("w") == pytest.approx(32_000 * 5 / 16, rel=0.03)  # re-sized as the ratio moved


def test_predictions_that_do_not_come_true_shrink_the_assumed_cache() -> None:
    units, approx = learner()
    units.set_engine_capacity("w", 16_000)
    assert approx.capacity("w") == 1_000
    for _ in range(10):
        finish(units, predicted=512, reported=0)  # whole misses: the largest step
    assert approx.capacity("w") < 1_000 * 0.85**9
    for _ in range(2_000):
        finish(units, predicted=512, reported=0)
    assert approx.capacity("w") == int(1_000 * CapacityConfig().min_scale)  # bounded
    small = approx.capacity("w")
    finish(units, predicted=512, reported=500)  # within a block of the prediction: nothing to learn
    assert approx.capacity("w") == small


def test_reports_above_the_prediction_grow_the_cache_only_while_it_is_full() -> None:
    units, approx = learner()
    units.set_engine_capacity("w", 1_600)  # 100 blocks
    approx.record_routed("w", range(50))  # half full
    for _ in range(10):
        finish(units, predicted=0, reported=256)
    assert approx.capacity("w") == 100  # it forgot nothing yet: TTL or others' traffic, not capacity
    approx.record_routed("w", range(50, 200))  # full, and it forgot the first 100 blocks
    for _ in range(10):
        finish(units, predicted=0, reported=256)
    assert 105 < approx.capacity("w") < 115  # it grew until what it holds no longer fills it
    for _ in range(2_000):
        approx.record_routed("w", range(approx.held("w") + 1_000))
        finish(units, predicted=0, reported=256)
    assert approx.capacity("w") == 100 * CapacityConfig().max_scale  # bounded above


def test_a_worker_read_from_events_corrects_nothing() -> None:
    units, approx = learner()
    units.set_engine_capacity("w", 16_000)
    for _ in range(50):
        finish(units, predicted=512, reported=0, approximate=False)
    assert approx.capacity("w") == 1_000
    assert units.units("w") is not None and units.units("w").misses == 0  # type: ignore[union-attr]


def test_status_says_what_was_learned() -> None:
    units, _ = learner(BYTES_PER_TOKEN)
    units.set_engine_capacity("w", 16_000)
    finish(units, gateway=5_600, engine=1_000, predicted=512, reported=0)
    got = units.units("w")
    assert got is not None
    assert got.as_dict() == {
        "gateway_tokens_per_engine_token": 5.6,
        "capacity_scale": 0.85,  # a whole miss: the largest step
        "assumed_capacity_blocks": int(16_000 * 5.6 * 0.85 / 16),
        "kept_capacity_blocks": int(16_000 * 5.6 * 0.85 / 16),
        "usage_samples": 1,
        "missed_predictions": 1,
        "short_predictions": 0,
    }


def test_the_index_keeps_placement_for_headroom_over_the_assumed_capacity() -> None:
    units, approx = learner(headroom=1.25)
    units.set_engine_capacity("w", 16_000)  # 1,000 blocks assumed
    status = units.units("w")
    assert status is not None
    assert status.pushed_blocks == 1_000 and status.kept_blocks == approx.capacity("w") == 1_250
    approx.record_routed("w", range(1_100))  # more than assumed: all of it still kept
    assert approx.held("w") == 1_100
    for _ in range(5):
        finish(units, predicted=0, reported=256)  # full by the assumed capacity, not by the kept one
    assert status.shortfalls >= 1 and status.pushed_blocks > 1_000
    assert CapacityConfig().headroom > 1  # the default keeps more than it assumes
    with pytest.raises(ValueError):
        CapacityConfig(headroom=0.9)


def test_memory_stays_within_the_budget_under_churn() -> None:
    approx = ApproximateKVIndex(ApproximateIndexConfig(max_blocks=2_000), clock=lambda: 0.0)
    units = CapacityLearner(approx, block_size=16)
    rng = random.Random(7)
    live: list[str] = []
    for step in range(3_000):
        if len(live) < 3 or rng.random() < 0.05:
            worker = f"w{step}"
            live.append(worker)
            units.set_engine_capacity(worker, 10_000_000)  # far more than the budget
        if len(live) > 12 and rng.random() < 0.05:
            gone = live.pop(rng.randrange(len(live)))
            approx.remove_worker(gone)
            units.forget(gone)
        worker = rng.choice(live)
        approx.record_routed(worker, [rng.getrandbits(64) for _ in range(rng.randint(1, 400))])
        for _ in range(3):
            finish(units, worker, predicted=0, reported=4_096)  # "grow": the budget still holds
        assert approx.num_blocks() <= 2_000
    assert approx.num_blocks() > 1_000  # the budget is used, not starved


def _closed_loop(real_blocks: int, assumed_blocks: int, requests: int) -> int:
    """One worker whose engine keeps ``real_blocks`` in an LRU, the gateway starting from
    ``assumed_blocks`` (16-token blocks, units equal): multi-turn sessions of growing prompts, each
    predicted from the index, answered by the LRU, then observed. What the index keeps at the end."""
    units, approx = learner(headroom=1.25, capacity_blocks=assumed_blocks)
    lru: OrderedDict[int, None] = OrderedDict()
    rng = random.Random(7)
    turns = [0] * 40
    for _ in range(requests):
        s = rng.randrange(len(turns))
        turns[s] += 1
        hashes = [s * 10_000 + i for i in range(8 * turns[s])]  # 8 new blocks a turn
        predicted = approx.longest_prefix(hashes, ["w"]).get("w")
        cached = 0
        while cached < len(hashes) and hashes[cached] in lru:
            cached += 1
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > real_blocks:
            lru.popitem(last=False)
        approx.record_routed("w", hashes)
        predicted_tokens = 16 * (predicted.gpu_blocks if predicted is not None else 0)
        finish(units, predicted=predicted_tokens, reported=16 * cached)
    return approx.capacity("w")


@pytest.mark.parametrize(("start", "requests"), [(30.0, 500), (3.0, 350), (0.3, 350)])
def test_a_worker_that_announces_nothing_is_learned_in_both_directions(start: float, requests: int) -> None:
    """Started 30× or 3× too large (the index's default against a small cache) or 3× too small, the assumed
    cache the index keeps comes near the engine's within a few hundred requests (with a fixed 3% step, the
    3× start was still 2.4× the engine's after 350)."""
    real = 2_000
    kept = _closed_loop(real, int(real * start), requests=requests)
    assert 0.7 * real < kept < 1.4 * real, kept

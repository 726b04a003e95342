"""pd_disaggregation: role pools, cache-aware prefill, load-based decode, and the uncached-tokens Decider."""

from __future__ import annotations

import pytest

from policies import Decision, PolicyContext, Role, RouteRequest, WorkerView, build_policy
from tests.unit.policies.fleets import worker

BS = 16
REQ = RouteRequest(model="m", num_prompt_tokens=64 * BS, block_hashes=tuple(range(64)))


def _select(fleet: list[WorkerView], **params: object) -> Decision:
    policy = build_policy({"type": "pd_disaggregation", "params": params}, PolicyContext(block_size=BS))
    return policy.select(REQ, fleet)


@pytest.mark.parametrize(
    ("fleet", "decode", "prefill"),
    [
        ([worker("p1", role=Role.PREFILL), worker("d1", role=Role.DECODE)], "d1", "p1"),
        (
            [
                worker("p1", role=Role.PREFILL),
                worker("p2", role=Role.PREFILL, gpu_hit_blocks=60),
                worker("d1", role=Role.DECODE, inflight_tokens=900),
                worker("d2", role=Role.DECODE, inflight_tokens=10),
            ],
            "d2",
            "p2",
        ),
        ([worker("p1", role=Role.PREFILL), worker("d1", role=Role.DECODE, gpu_hit_blocks=60)], "d1", None),
        ([worker("p1", role=Role.PREFILL), worker("d1", role=Role.DECODE, tier_hit_blocks=64)], "d1", None),
        ([worker("p1", role=Role.PREFILL, healthy=False), worker("d1", role=Role.DECODE)], "d1", None),
        ([worker("d1", role=Role.DECODE)], "d1", None),
        ([worker("p1", role=Role.PREFILL), worker("p2", role=Role.PREFILL)], None, None),
        ([worker("b1", role=Role.BOTH), worker("p1", role=Role.PREFILL, gpu_hit_blocks=40)], "b1", "p1"),
        ([worker("b1", role=Role.BOTH, gpu_hit_blocks=10), worker("p1", role=Role.PREFILL)], "b1", None),
    ],
    ids=[
        "prefill_and_decode_pools",
        "prefill_cache_aware_decode_by_load",
        "skips_when_decode_worker_holds_the_prompt",
        "skips_when_the_tier_holds_the_prompt",
        "decode_prefills_itself_without_healthy_prefill_worker",
        "decode_only_fleet",
        "no_decode_worker_no_decision",
        "both_worker_decodes_prefill_elsewhere",
        "both_worker_prefills_itself_when_it_is_cheapest",
    ],
)
def test_pd_pools_and_decider(fleet: list[WorkerView], decode: str | None, prefill: str | None) -> None:
    decision = _select(fleet)
    assert (decision.worker, decision.prefill_worker) == (decode, prefill)


@pytest.mark.parametrize(
    ("threshold", "expected_prefill"), [(256, "p1"), (2048, None)], ids=["below_threshold", "above_threshold"]
)
def test_threshold_on_uncached_tokens(threshold: int, expected_prefill: str | None) -> None:
    fleet = [worker("p1", role=Role.PREFILL), worker("d1", role=Role.DECODE)]
    assert _select(fleet, min_uncached_tokens=threshold).prefill_worker == expected_prefill


def test_single_both_worker_prefills_itself() -> None:
    decision = _select([worker("b1", role=Role.BOTH)])
    assert (decision.worker, decision.prefill_worker) == ("b1", None)


def test_prefill_params_are_validated() -> None:
    from policies import PolicyConfigError

    with pytest.raises(PolicyConfigError, match=r"params\.prefill.*nope"):
        build_policy({"type": "pd_disaggregation", "params": {"prefill": {"nope": 1}}}, PolicyContext())

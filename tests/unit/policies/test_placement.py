"""New streams and follow-ups: how a routed request relates to the caches it was chosen among."""

from __future__ import annotations

from policies.api import WorkerId, WorkerView
from policies.placement import Placement, is_free, placement_of


def view(name: str, gpu: int = 0, tier: int = 0) -> WorkerView:
    return WorkerView(id=WorkerId(name), gpu_hit_blocks=gpu, tier_hit_blocks=tier)


def test_a_prompt_nobody_holds_starts_a_new_stream_wherever_it_lands() -> None:
    pool = [view("a"), view("b"), view("c")]
    assert is_free(pool)
    assert placement_of(pool, WorkerId("b")) is Placement.NEW_STREAM


def test_a_prefix_every_worker_holds_alike_is_still_a_free_placement() -> None:
    # a system prompt cached everywhere, and one block shared by chance on one worker
    pool = [view("a", gpu=20), view("b", gpu=21), view("c", gpu=20)]
    assert placement_of(pool, WorkerId("a")) is Placement.NEW_STREAM


def test_going_where_more_of_the_prompt_is_held_follows_a_stream() -> None:
    pool = [view("a", gpu=30), view("b", gpu=2), view("c")]
    assert not is_free(pool)
    assert placement_of(pool, WorkerId("a")) is Placement.FOLLOW_UP
    assert placement_of(pool, WorkerId("b")) is Placement.FOLLOW_UP  # 2 blocks over the least: a partial hit
    assert placement_of(pool, WorkerId("c")) is Placement.OTHER  # a spill away from the warm worker


def test_shared_tier_blocks_count_as_held() -> None:
    pool = [view("a", tier=8), view("b", gpu=8)]
    assert is_free(pool)
    assert placement_of([view("a", tier=8), view("b")], WorkerId("a")) is Placement.FOLLOW_UP


def test_an_empty_pool_is_not_free() -> None:
    assert not is_free([])

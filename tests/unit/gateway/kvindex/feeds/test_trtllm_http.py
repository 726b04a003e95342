"""TensorRT-LLM's HTTP drain (``POST /kv_cache_events``) mapped onto kvgate blocks, and its poller."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from gateway.kvindex.feeds.decode import AllBlocksCleared, BlockRemoved, BlockStored
from gateway.kvindex.feeds.feed_status import FeedStatus
from gateway.kvindex.feeds.rechunk import EngineEventTranslator, TranslatorConfig
from gateway.kvindex.feeds.trtllm_http import DrainError, TrtllmDrainMapper, run_trtllm_drain
from kvgate_core.kvcontract.events import EventType, KVEvent
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash

PROMPT = list(range(100, 228))


def block(block_hash: int, tokens: list[int], *, extra: int = 0, level: int = 0) -> dict[str, Any]:
    return {
        "type": "stored_block", "block_hash": block_hash, "cache_level": level, "priority": 35,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": extra} for t in tokens],
    }  # fmt: skip


def event(event_id: int, data: dict[str, Any], window: int = 4096, **extra: Any) -> dict[str, Any]:
    return {"event_id": event_id, "window_size": window, "data": data, **extra}


def stored(event_id: int, parent: int | None, *blocks: dict[str, Any], window: int = 4096) -> dict[str, Any]:
    return event(event_id, {"type": "stored", "parent_hash": parent, "blocks": list(blocks)}, window)


def mapper(block_size: int | None = None) -> tuple[TrtllmDrainMapper, FeedStatus, Counter[str]]:
    status, skipped = FeedStatus("http://w", clock=lambda: 0.0), Counter[str]()
    return TrtllmDrainMapper(status, skipped, block_size), status, skipped


def test_created_updated_ignored_stored_and_removed_mapped() -> None:
    m, status, _ = mapper()
    drained = [
        event(0, {"type": "created", "num_blocks_per_cache_level": [100, 0]}),
        stored(1, None, block(11, PROMPT[:32]), block(12, PROMPT[32:64])),
        event(2, {"type": "updated", "block_hash": 11, "cache_level": {}, "priority": {}}),
        event(3, {"type": "removed", "block_hashes": [12]}),
    ]
    assert m.map(drained) == [
        BlockStored([11, 12], None, PROMPT[:64], 32, medium="GPU", mm_keys=[[], []]),
        BlockRemoved([12], medium="GPU"),
    ]
    assert (status.num_gaps, status.num_resyncs) == (0, 0)


def test_partial_blocks_are_dropped_and_multimodal_blocks_marked() -> None:
    m, _, skipped = mapper(32)
    (partial,) = m.map([stored(0, None, block(1, PROMPT[:32]), block(2, PROMPT[32:40]))])
    assert isinstance(partial, BlockStored)
    assert (list(partial.block_hashes), partial.token_ids) == ([1], PROMPT[:32])
    assert skipped == {"partial block": 1}
    (mm,) = m.map([stored(1, 1, block(3, PROMPT[32:64], extra=77))])
    assert isinstance(mm, BlockStored)
    assert mm.mm_keys == [["token_extra_id"]]


def test_only_the_largest_window_is_kept_and_a_larger_one_resyncs() -> None:
    m, status, _ = mapper(32)
    assert m.map([stored(0, None, block(1, PROMPT[:32]), window=128)])[0] == BlockStored(
        [1], None, PROMPT[:32], 32, medium="GPU", mm_keys=[[]]
    )
    mapped = m.map(
        [stored(1, None, block(2, PROMPT[:32]), window=4096), stored(2, None, block(3, PROMPT[:32]))]
    )
    assert mapped[0] == AllBlocksCleared()
    assert [e.block_hashes for e in mapped[1:] if isinstance(e, BlockStored)] == [[2], [3]]
    assert m.map([stored(3, None, block(4, PROMPT[:32]), window=128)]) == []
    assert status.num_resyncs == 1


def test_the_initial_created_burst_of_several_windows_needs_no_resync() -> None:
    m, status, _ = mapper(32)
    created = {"type": "created", "num_blocks_per_cache_level": [100, 0]}
    drained = [
        event(0, created, 128),
        event(1, created, 4096),
        stored(2, None, block(1, PROMPT[:32]), window=128),
    ]
    assert m.map(drained) == []
    assert status.num_resyncs == 0


def test_event_id_gaps_resync_per_rank() -> None:
    m, status, _ = mapper(32)
    rank1 = {"attention_dp_rank": 1}
    m.map([stored(5, None, block(1, PROMPT[:32])) | rank1, stored(0, None, block(2, PROMPT[:32]))])
    removed = event(6, {"type": "removed", "block_hashes": [1]}) | rank1
    assert m.map([removed, event(1, {"type": "removed", "block_hashes": [2]})]) == [
        BlockRemoved([1], medium="GPU"),
        BlockRemoved([2], medium="GPU"),
    ]
    assert m.map([event(9, {"type": "removed", "block_hashes": [1]}) | rank1])[0] == AllBlocksCleared()
    assert (status.num_gaps, status.num_resyncs) == (1, 1)


def test_learned_block_size_grows_with_a_resync() -> None:
    m, status, _ = mapper()
    assert isinstance(m.map([stored(0, None, block(1, PROMPT[:16]))])[0], BlockStored)
    mapped = m.map([stored(1, None, block(2, PROMPT[:32]))])
    assert mapped[0] == AllBlocksCleared()
    assert isinstance(mapped[1], BlockStored)
    assert mapped[1].block_size == 32
    assert status.num_resyncs == 1


@pytest.mark.parametrize("body", [{"events": []}, [1, 2]], ids=["not-a-list", "not-objects"])
def test_unreadable_answers_raise(body: Any) -> None:
    from kvgate_core.kvcontract.events import EventDecodeError

    with pytest.raises(EventDecodeError):
        mapper()[0].map(body)


async def test_the_poller_posts_translates_and_resyncs_on_bad_answers() -> None:
    answers: list[Any] = [
        [stored(0, None, block(1, PROMPT[:32]))],
        DrainError("connection refused"),
        [],
        {"bad": "shape"},
        [stored(1, None, block(2, PROMPT[:32]))],
    ]
    posted: list[str] = []
    sunk: list[KVEvent] = []

    async def post(url: str) -> Any:
        posted.append(url)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def sleep(_s: float) -> None:
        if not answers:
            raise asyncio.CancelledError
        await asyncio.sleep(0)

    translator = EngineEventTranslator(TranslatorConfig("trt-0", "m", 16))
    status = FeedStatus("http://w:8000", clock=lambda: 0.0)
    with pytest.raises(asyncio.CancelledError):
        await run_trtllm_drain(
            "http://w:8000/", post=post, translator=translator, sink=sunk.extend, status=status, sleep=sleep
        )
    ours = chain_hashes(PROMPT[:32], root_hash("m"), 16)
    assert posted == ["http://w:8000/kv_cache_events"] * 5
    assert [(e.type, list(e.hashes)) for e in sunk] == [
        (EventType.STORED, ours),
        (EventType.CLEARED, []),
        (EventType.STORED, ours),
    ]
    assert (status.num_batches, status.num_bad_batches, status.num_resyncs) == (3, 1, 1)
    assert status.state == "flowing"

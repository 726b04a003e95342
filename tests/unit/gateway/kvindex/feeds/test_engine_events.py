from __future__ import annotations

import msgpack
import pytest

from gateway.kvindex.feeds.decode import decode_batch
from gateway.kvindex.feeds.rechunk import EngineEventTranslator, TranslatorConfig
from gateway.kvindex.feeds.sglang import decode_sglang_batch
from kvgate_core.kvcontract.events import EventDecodeError, EventType
from kvgate_core.kvcontract.extra_keys import extra_keys
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from tests.unit.gateway.kvindex.vllm_batches import (
    BLOCK,
    MODEL,
    array_batch,
    map_batch,
    removed_array,
    removed_map,
    stored_array,
    stored_map,
    tokens,
)


def translator() -> EngineEventTranslator:
    return EngineEventTranslator(TranslatorConfig(worker="vllm-0", model=MODEL, block_size=BLOCK))


def ours(toks: list[int], lora: str | None = None) -> list[int]:
    return chain_hashes(toks, root_hash(MODEL, extra_keys(lora=lora)), BLOCK)


@pytest.mark.parametrize(
    ("batch", "engine_hashes"),
    [
        (array_batch(stored_array([11, 12], None, tokens(2))), [11, 12]),
        (map_batch(stored_map([b"\x01" * 32, b"\x02" * 32], None, tokens(2))), [b"\x01" * 32, b"\x02" * 32]),
    ],
    ids=["positional-int-hashes", "tagged-map-bytes-hashes"],
)
def test_stored_blocks_are_rehashed_into_our_scheme(batch: bytes, engine_hashes: list[int | bytes]) -> None:
    events = translator().translate(decode_batch(batch))
    assert [(e.worker, e.type, list(e.hashes)) for e in events] == [
        ("vllm-0", EventType.STORED, ours(tokens(2)))
    ]


def test_a_child_event_chains_from_its_parent_and_removed_is_translated() -> None:
    t = translator()
    full = tokens(3)
    t.translate(decode_batch(array_batch(stored_array([1, 2], None, full[: 2 * BLOCK]))))
    child = t.translate(decode_batch(map_batch(stored_map([3], 2, full[2 * BLOCK :]))))
    assert list(child[0].hashes) == ours(full)[2:]
    gone = t.translate(decode_batch(array_batch(removed_array([2, 99]))))
    assert [(e.type, list(e.hashes)) for e in gone] == [(EventType.REMOVED, [ours(full)[1]])]


def test_lora_name_is_folded_into_the_root() -> None:
    events = translator().translate(decode_batch(map_batch(stored_map([5], None, tokens(1), lora_name="ad"))))
    assert list(events[0].hashes) == ours(tokens(1), lora="ad")


@pytest.mark.parametrize(
    "event",
    [
        stored_array([7], 12345, tokens(1)),  # parent never seen
        ["BlockStored", [7], None, tokens(1), 32, None, "GPU"],  # 32-token blocks, 16 tokens
        stored_array([7], None, tokens(1), medium="CPU"),  # engine-local offload medium
        ["BlockStored", [7, 8], None, tokens(1), BLOCK, None, "GPU"],  # token count disagrees
    ],
    ids=["orphan", "block-size", "cpu-medium", "short-tokens"],
)
def test_untranslatable_stores_are_skipped_and_counted(event: list[object]) -> None:
    t = translator()
    assert t.translate(decode_batch(array_batch(event))) == []
    assert t.num_skipped == 1


def test_all_blocks_cleared_clears_the_worker_and_the_hash_map() -> None:
    t = translator()
    t.translate(decode_batch(array_batch(stored_array([1], None, tokens(1)))))
    events = t.translate(decode_batch(array_batch(["AllBlocksCleared"])))
    assert [e.type for e in events] == [EventType.CLEARED]
    assert t.translate(decode_batch(map_batch(removed_map([1])))) == []


def test_sglang_positional_layout_has_no_medium() -> None:
    batch = msgpack.packb([1.0, [["BlockStored", [4], None, tokens(1), BLOCK, None], ["BlockRemoved", [4]]]])
    events = translator().translate(decode_sglang_batch(batch))
    assert [e.type for e in events] == [EventType.STORED, EventType.REMOVED]


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgpack.packb({"ts": 1.0}), msgpack.packb([1.0, [42]])],
    ids=["not-msgpack", "no-events", "not-an-event"],
)
def test_malformed_batches_raise_decode_errors(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_batch(payload)


def test_unknown_event_tags_are_skipped_and_counted_not_fatal() -> None:
    t = translator()
    batch = msgpack.packb([1.0, [["Nope"], stored_array([1], None, tokens(1))]])
    assert [e.type for e in t.translate(decode_batch(batch))] == [EventType.STORED]
    assert t.skipped == {"unknown event type 'Nope'": 1}

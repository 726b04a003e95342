"""The one decoder: vLLM, SGLang and TensorRT-LLM batches, tagged maps and tagged arrays, int/bytes/str hashes."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from gateway.kvindex.feeds.decode import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    UnknownEvent,
    decode_event,
    decode_event_batch,
)
from kvgate_core.kvcontract.events import EventDecodeError

TOKENS = list(range(32))


def pack(*events: Any, rank: int | None = 0) -> bytes:
    return bytes(msgpack.packb([12.5, list(events), rank]))


def test_vllm_tagged_map_with_every_field() -> None:
    event = {
        "type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": TOKENS,
        "block_size": 16, "lora_id": 3, "medium": "GPU", "lora_name": "sql",
        "extra_keys": [["sql", "salt-1"], ["sql"]], "group_idx": 0, "kv_cache_spec_kind": "full_attention",
        "kv_cache_spec_sliding_window": None, "locality": "LOCAL", "ownership": None, "session_id": "s1",
    }  # fmt: skip
    batch = decode_event_batch(pack(event, rank=1))
    assert (batch.ts, batch.dp_rank) == (12.5, 1)
    assert batch.events == [
        BlockStored(
            [1, 2], None, TOKENS, 16, medium="GPU", lora_id=3, lora_name="sql",
            extra_keys=[["sql", "salt-1"], ["sql"]], group_idx=0, spec_kind="full_attention",
            locality="LOCAL", session_id="s1",
        )
    ]  # fmt: skip


def test_vllm_tagged_array_in_field_order_with_trailing_defaults_omitted() -> None:
    stored = ["BlockStored", [b"\x01" * 32], b"\x00" * 32, TOKENS[:16], 16, None, "GPU", None, [None], 1]
    removed = ["BlockRemoved", [b"\x01" * 32], "CPU", 1]
    events = decode_event_batch(pack(stored, removed, ["AllBlocksCleared"])).events
    assert events == [
        BlockStored(
            [b"\x01" * 32], b"\x00" * 32, TOKENS[:16], 16, medium="GPU", extra_keys=[None], group_idx=1
        ),
        BlockRemoved([b"\x01" * 32], medium="CPU", group_idx=1),
        AllBlocksCleared(),
    ]


def test_sglang_old_positional_and_new_map_fields() -> None:
    old = ["BlockStored", [-5], None, TOKENS[:1], 1, None]  # signed int64 page hashes, page size 1
    new = {
        "type": "BlockStored", "block_hashes": [-6], "parent_block_hash": -5, "token_ids": TOKENS[1:2],
        "block_size": 1, "lora_id": None, "medium": "GPU", "cache_salt": "tenant-a", "session_id": "x",
        "lora_name": "ad",
    }  # fmt: skip
    events = decode_event_batch(pack(old, new, ["BlockRemoved", [-6]])).events
    assert events == [
        BlockStored([-5], None, [0], 1),
        BlockStored([-6], -5, [1], 1, medium="GPU", cache_salt="tenant-a", session_id="x", lora_name="ad"),
        BlockRemoved([-6]),
    ]


def test_trtllm_map_with_string_tokens_and_mm_keys() -> None:
    mm_key = {"type": "mm_key", "hash": "ab" * 32, "start_offset": 3}
    event = {
        "type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [1, "img", 2, 3],
        "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None, "mm_keys": [[mm_key]],
    }  # fmt: skip
    (stored,) = decode_event_batch(pack(event)).events
    assert isinstance(stored, BlockStored)
    assert stored.token_ids == [1, "img", 2, 3]
    assert stored.mm_keys == [[mm_key]]


@pytest.mark.parametrize(
    "engine_hash", [2**64 - 1, -(2**63), b"\xff" * 32, "c0ffee"], ids=["u64", "i64", "bytes", "str"]
)
def test_block_hashes_may_be_int_bytes_or_str(engine_hash: Any) -> None:
    assert decode_event({"type": "BlockRemoved", "block_hashes": [engine_hash]}) == BlockRemoved(
        [engine_hash]
    )


def test_a_map_batch_envelope_and_unknown_tags() -> None:
    payload = msgpack.packb({"ts": 2.0, "events": [{"type": "BlockPinned", "x": 1}, ["Future", 1, 2]]})
    batch = decode_event_batch(payload)
    assert batch.events == [UnknownEvent("BlockPinned"), UnknownEvent("Future")]
    assert batch.dp_rank is None


@pytest.mark.parametrize(
    "event",
    [
        {"type": "BlockRemoved", "block_hashes": 5},
        {"type": "BlockRemoved", "block_hashes": [[1]]},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": "abc", "block_size": 16},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": 0},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": 16, "medium": 1},
        {"type": "BlockStored", "block_hashes": [True], "token_ids": [], "block_size": 16},
        "BlockStored",
    ],
    ids=["hashes-not-list", "hash-list", "tokens-str", "block-size-0", "medium-int", "bool-hash", "bare-str"],
)
def test_malformed_known_events_raise(event: Any) -> None:
    with pytest.raises(EventDecodeError):
        decode_event(event)

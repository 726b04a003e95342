"""Re-hashing engine blocks of any size into kvgate blocks that equal what the gateway computes for a request.

The expected hashes come from the gateway's own request side (``TokenizingAnalyzer`` on a token-id prompt),
so a translated block and a request's block can only agree if both sides name the prefix the same way.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.analyze.prompt import TokenizingAnalyzer
from gateway.kvindex.feeds.decode import AllBlocksCleared, BlockRemoved, BlockStored, EngineEvent
from gateway.kvindex.feeds.rechunk import EngineEventTranslator, TranslatorConfig
from gateway.kvindex.memory import MemoryKVIndex
from kvgate_core.kvcontract.events import EventType, KVEvent
from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint

MODEL = "m"
PROMPT = [(7 * i + 3) % 50_000 for i in range(256)]


def gateway_hashes(tokens: list[int], block_size: int = 16, **body: Any) -> list[int]:
    """What the gateway computes for a request carrying ``tokens`` (and ``body`` fields)."""
    analyzer = TokenizingAnalyzer(byte_bundle(), block_size=block_size)
    request = {"model": body.pop("model", MODEL), "prompt": tokens, **body}
    return list(analyzer.analyze(request, Endpoint.COMPLETIONS, request["model"]).block_hashes)


def translator(block_size: int = 16, **kw: Any) -> EngineEventTranslator:
    return EngineEventTranslator(TranslatorConfig("w", MODEL, block_size, **kw))


def stored(hashes: list[Any], parent: Any, tokens: list[Any], size: int, **kw: Any) -> BlockStored:
    return BlockStored(hashes, parent, tokens, size, medium="GPU", **kw)


def pages(tokens: list[int], size: int, first_hash: int = 1000, parent: Any = None) -> list[EngineEvent]:
    """One event per engine page (SGLang's way), each chained to the previous page."""
    out: list[EngineEvent] = []
    for i in range(len(tokens) // size):
        out.append(stored([first_hash + i], parent, tokens[i * size : (i + 1) * size], size))
        parent = first_hash + i
    return out


def stored_hashes(events: list[KVEvent]) -> list[int]:
    return [h for e in events if e.type is EventType.STORED for h in e.hashes]


def test_a_32_token_engine_block_is_two_gateway_blocks_and_removal_removes_both() -> None:
    t = translator()
    events = t.translate([stored([11, 12], None, PROMPT[:64], 32)])
    assert stored_hashes(events) == gateway_hashes(PROMPT[:64])
    gone = t.translate([BlockRemoved([12], "GPU")])
    assert [(e.type, list(e.hashes)) for e in gone] == [(EventType.REMOVED, gateway_hashes(PROMPT[:64])[2:])]


def test_128_token_blocks_chain_across_batches() -> None:
    t = translator()
    first = t.translate([stored([1], None, PROMPT[:128], 128)])
    second = t.translate([stored([2], 1, PROMPT[128:256], 128)])
    assert stored_hashes(first) + stored_hashes(second) == gateway_hashes(PROMPT)


@pytest.mark.parametrize("page", [1, 16], ids=["sglang-page-1", "page-16"])
def test_pages_accumulate_into_64_token_gateway_blocks_partial_tail_not_indexed(page: int) -> None:
    t = translator(64)
    tokens = PROMPT[:150]  # two full 64-token blocks and a 22-token tail
    usable = tokens[: len(tokens) // page * page]
    out: list[KVEvent] = []
    for event in pages(usable, page):  # one batch per page: the chain is carried across batches
        out += t.translate([event])
    assert stored_hashes(out) == gateway_hashes(tokens, 64)
    assert len(stored_hashes(out)) == 2


def test_removing_any_page_of_a_gateway_block_removes_that_block() -> None:
    t = translator(64)
    t.translate(pages(PROMPT[:128], 16))  # pages 1000..1007: blocks [1000-1003], [1004-1007]
    blocks = gateway_hashes(PROMPT[:128], 64)
    assert [list(e.hashes) for e in t.translate([BlockRemoved([1001])])] == [blocks[:1]]
    assert [list(e.hashes) for e in t.translate([BlockRemoved([1007])])] == [blocks[1:]]


def test_pages_of_one_event_and_branches_from_a_shared_page() -> None:
    t = translator(4)
    shared = t.translate([stored([1, 2, 3], None, PROMPT[:6], 2)])  # 6 tokens: one block + 2 pending
    branch = [*PROMPT[:6], 901, 902]
    left = t.translate([stored([4], 3, PROMPT[6:8], 2)])
    right = t.translate([stored([5], 3, [901, 902], 2)])
    assert stored_hashes(shared) == gateway_hashes(PROMPT[:6], 4)
    assert stored_hashes(left) == gateway_hashes(PROMPT[:8], 4)[1:]
    assert stored_hashes(right) == gateway_hashes(branch, 4)[1:]
    # page 3 is in both second blocks: removing it removes both
    removed = t.translate([BlockRemoved([3])])
    assert set(removed[0].hashes) == {*stored_hashes(left), *stored_hashes(right)}


def test_other_ratios_are_skipped_with_a_counted_reason() -> None:
    t = translator()
    assert t.translate([stored([1], None, PROMPT[:24], 24)]) == []
    assert t.skipped == {"engine block size 24 and gateway block size 16 do not divide": 1}


def test_all_blocks_cleared_clears_the_worker_and_forgets_the_chains() -> None:
    t = translator()
    t.translate([stored([1], None, PROMPT[:32], 32)])
    assert [e.type for e in t.translate([AllBlocksCleared()])] == [EventType.CLEARED]
    assert t.translate([stored([2], 1, PROMPT[32:64], 32)]) == []
    assert t.num_mapped == 0


@pytest.mark.parametrize(
    ("event", "body"),
    [
        (stored([1], None, PROMPT[:32], 32, cache_salt="tenant-a"), {"cache_salt": "tenant-a"}),  # SGLang
        (stored([1], None, PROMPT[:32], 32, extra_keys=[["tenant-a"]]), {"cache_salt": "tenant-a"}),  # vLLM
        (stored([1], None, PROMPT[:32], 32, lora_name="sql", extra_keys=[["sql"]]), {"lora": "sql"}),
        (
            stored([1], None, PROMPT[:32], 32, lora_name="sql", extra_keys=[["sql", "s"]]),
            {"lora": "sql", "cache_salt": "s"},
        ),
    ],
    ids=["sglang-cache-salt", "vllm-extra-keys-salt", "lora-key", "lora-and-salt"],
)
def test_namespaces_match_the_request_side(event: BlockStored, body: dict[str, Any]) -> None:
    assert stored_hashes(translator().translate([event])) == gateway_hashes(PROMPT[:32], **body)
    assert gateway_hashes(PROMPT[:32], **body) != gateway_hashes(PROMPT[:32])


def test_vllm_lora_adapters_root_the_chain_like_a_request_naming_them_in_model() -> None:
    event = stored([1], None, PROMPT[:32], 32, lora_name="sql-lora", lora_id=1, extra_keys=[["sql-lora"]])
    ours = stored_hashes(translator(lora_in_model=True).translate([event]))
    assert ours == gateway_hashes(PROMPT[:32], model="sql-lora")


def test_sglang_extra_key_requests_never_match_plain_blocks() -> None:
    plain = stored_hashes(translator().translate([stored([1], None, PROMPT[:32], 32)]))
    assert plain == gateway_hashes(PROMPT[:32])
    assert not set(plain) & set(gateway_hashes(PROMPT[:32], extra_key="k"))


def test_trtllm_salted_requests_never_match_blocks_its_drain_reports() -> None:
    """TensorRT-LLM's ``cache_salt`` enters its block keys but not its events: the drained blocks (whichever
    request stored them) are indexed plain, and a salted request is never predicted to hit them."""
    from collections import Counter

    from gateway.kvindex.feeds.feed_status import FeedStatus
    from gateway.kvindex.feeds.trtllm_http import TrtllmDrainMapper

    mapper = TrtllmDrainMapper(FeedStatus("http://w", clock=lambda: 0.0), Counter(), 32)
    tokens = [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in PROMPT[:32]]
    drained = [{"event_id": 0, "window_size": 4096, "data": {"type": "stored", "parent_hash": None, "blocks": [
        {"type": "stored_block", "block_hash": 5, "cache_level": 0, "priority": 35, "tokens": tokens},
    ]}}]  # fmt: skip
    plain = stored_hashes(translator().translate(mapper.map(drained)))
    assert plain == gateway_hashes(PROMPT[:32])
    assert not set(plain) & set(gateway_hashes(PROMPT[:32], cache_salt="tenant-a"))


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (
            stored([1, 2], None, PROMPT[:64], 32, extra_keys=[None, [["img", 0]]]),
            "multimodal or prompt-embeds",
        ),
        (
            stored([1, 2], None, PROMPT[:64], 32, extra_keys=[None, [b"digest"]]),
            "multimodal or prompt-embeds",
        ),
        (stored([1, 2], None, PROMPT[:64], 32, mm_keys=[[], [{"hash": "ab"}]]), "multimodal block (mm_keys)"),
        (stored([1, 2], None, [*PROMPT[:32], "x", *PROMPT[33:64]], 32), "non-integer or out-of-range"),
    ],
    ids=["vllm-mm-pair", "vllm-prompt-embeds", "trtllm-mm-keys", "trtllm-str-token"],
)
def test_multimodal_blocks_and_their_descendants_are_not_indexed(event: BlockStored, reason: str) -> None:
    t = translator()
    assert stored_hashes(t.translate([event])) == gateway_hashes(PROMPT[:32])  # the first block only
    assert any(r.startswith(reason) for r in t.skipped)
    assert t.translate([stored([3], 2, PROMPT[64:96], 32)]) == []  # child of the unindexed block


@pytest.mark.parametrize(
    "event",
    [
        stored([1], 99, PROMPT[:32], 32),
        BlockStored([1], None, PROMPT[:32], 32, medium="CPU"),
        BlockStored([1], None, PROMPT[:32], 32, locality="REMOTE"),
        stored([1], None, PROMPT[:32], 32, spec_kind="sliding_window", group_idx=1),
        stored([1], None, PROMPT[:32], 32, lora_id=4),
        stored([1, 2], None, PROMPT[:32], 32),
    ],
    ids=["orphan", "cpu-medium", "remote", "sliding-window-group", "lora-id-without-name", "short-tokens"],
)
def test_unindexable_stores_are_skipped_and_counted(event: BlockStored) -> None:
    t = translator()
    assert t.translate([event]) == []
    assert t.num_skipped == 1


def test_only_the_first_full_attention_group_is_followed() -> None:
    t = translator()
    full = stored([1], None, PROMPT[:32], 32, spec_kind="full_attention", group_idx=0)
    other = stored([1], None, PROMPT[:32], 32, spec_kind="full_attention", group_idx=2)
    assert len(stored_hashes(t.translate([full]))) == 2
    assert t.translate([other, BlockRemoved([1], "GPU", group_idx=1)]) == []
    assert len(t.translate([BlockRemoved([1], "GPU", group_idx=0)])[0].hashes) == 2


def test_a_restored_block_keeps_its_blocks_and_the_lru_bounds_the_map() -> None:
    t = translator(max_mapped=2)
    t.translate([stored([1], None, PROMPT[:32], 32)])
    assert stored_hashes(t.translate([stored([1], None, PROMPT[:32], 32)])) == gateway_hashes(PROMPT[:32])
    t.translate([stored([2], 1, PROMPT[32:64], 32), stored([3], 2, PROMPT[64:96], 32)])
    assert t.num_mapped == 2
    assert t.translate([BlockRemoved([1], "GPU")]) == []  # evicted from the map


def test_translated_blocks_give_a_prefix_hit_for_the_request() -> None:
    index, t = MemoryKVIndex(), translator()
    for event in t.translate(pages(PROMPT[:96], 32)):
        index.apply(event)
    hit = index.longest_prefix(gateway_hashes(PROMPT[:100]), ["w"])["w"]
    assert hit.gpu_blocks == 6

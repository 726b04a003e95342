"""``EngineCore`` end to end on the tiny model: greedy output against ``transformers`` by full recompute,
prefix caching, chunked prefill, preemption and aborts."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM as HFLlama

from tests.unit.workers.engine.tiny_engine import (
    build_core,
    greedy_request,
    hf_greedy,
    hf_reference,
    run_to_completion,
    tiny_model,
    tokens_of,
)
from workers.engine.llama import LlamaForCausalLM
from workers.engine_api import FinishReason

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_model()


@pytest.fixture(scope="module")
def hf(model: LlamaForCausalLM) -> HFLlama:
    return hf_reference(model)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    shared = torch.randint(0, 256, (10,), generator=gen).tolist()
    tails = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 9, 1, 14, 6)]
    return [shared + tail for tail in tails]


@pytest.fixture(scope="module")
def expected(hf: HFLlama, prompts: list[list[int]]) -> list[list[int]]:
    return [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]


def _run_all(core, prompts: list[list[int]]) -> list[list[int]]:
    for i, p in enumerate(prompts):
        core.submit(greedy_request(f"r{i}", p, MAX_TOKENS))
    out = run_to_completion(core)
    return [tokens_of(out[f"r{i}"]) for i in range(len(prompts))]


def test_batched_greedy_matches_transformers(model, prompts, expected) -> None:
    core = build_core(model)
    assert _run_all(core, prompts) == expected


def test_prefix_cache_hit_reports_cached_blocks_and_keeps_output(model, prompts, expected) -> None:
    core = build_core(model, block_size=4)
    core.submit(greedy_request("first", prompts[1], MAX_TOKENS))
    first = run_to_completion(core)["first"]
    assert first[-1].num_cached_tokens == 0
    core.submit(greedy_request("second", prompts[3], MAX_TOKENS))  # shares the 10-token prefix
    second = run_to_completion(core)["second"]
    assert second[-1].num_cached_tokens == 8  # two full 4-token blocks of the shared 10 tokens
    assert tokens_of(second) == expected[3]
    core.submit(greedy_request("again", prompts[1], MAX_TOKENS))  # a whole prompt seen before
    again = run_to_completion(core)["again"]
    assert again[-1].num_cached_tokens == (len(prompts[1]) - 1) // 4 * 4
    assert tokens_of(again) == expected[1]


def test_chunked_prefill_equals_unchunked(model, prompts, expected) -> None:
    core = build_core(model, max_batched_tokens=5)
    assert _run_all(core, prompts) == expected


def test_preemption_under_a_tiny_kv_budget_completes_every_request(model, prompts, expected) -> None:
    # 12 blocks of 4 tokens: any one sequence fits, five together cannot.
    core = build_core(model, num_blocks=12, block_size=4)
    assert _run_all(core, prompts) == expected
    assert core.scheduler.num_preemptions > 0
    assert core.scheduler.blocks.num_free_blocks == 12


def test_a_long_prompt_is_prefilled_beside_running_decodes(model, prompts) -> None:
    core = build_core(model, max_batched_tokens=6)
    core.submit(greedy_request("short", prompts[2], 30))
    while core.scheduler.running[0].num_uncomputed_tokens > 1 if core.scheduler.running else True:
        core.step()
    core.submit(greedy_request("long", prompts[2] * 4, 2))
    produced_while_long_prefills = 0
    for _ in range(4):
        chunks = dict(core.step().chunks)
        produced_while_long_prefills += "short" in chunks and "long" not in chunks
    assert produced_while_long_prefills == 4


def test_abort_frees_every_block(model, prompts) -> None:
    core = build_core(model, num_blocks=32, block_size=4)
    core.submit(greedy_request("a", prompts[0], 50))
    core.submit(greedy_request("b", prompts[3], 50))
    for _ in range(3):
        core.step()
    assert core.scheduler.blocks.num_free_blocks < 32
    core.abort("a")
    core.abort("b")
    result = core.step()
    assert result.chunks == []
    assert not core.has_work
    assert core.scheduler.blocks.num_free_blocks == 32


def test_stop_token_and_max_tokens_end_a_request(model, prompts, expected) -> None:
    core = build_core(model)
    stop_at = expected[0][3]
    core.submit(greedy_request("stop", prompts[0], MAX_TOKENS, stop_token_ids=(stop_at,)))
    core.submit(greedy_request("len", prompts[0], 2))
    out = run_to_completion(core)
    assert tokens_of(out["stop"]) == expected[0][: expected[0].index(stop_at) + 1]
    assert out["stop"][-1].finish_reason is FinishReason.STOP
    assert tokens_of(out["len"]) == expected[0][:2]
    assert out["len"][-1].finish_reason is FinishReason.LENGTH


def test_stored_events_name_the_cached_blocks(model, prompts) -> None:
    core = build_core(model, block_size=4)
    core.submit(greedy_request("a", prompts[0], 3))
    stored: list[int] = []
    while core.has_work:
        stored += [h for e in core.step().events for h in e.hashes]
    assert stored == core.scheduler.blocks.cached_hashes()
    assert len(stored) == (len(prompts[0]) + 3 - 1) // 4


def test_random_workload_with_aborts_under_pressure_keeps_outputs_and_leaks_nothing(model) -> None:
    rng = torch.Generator().manual_seed(11)
    base = torch.randint(0, 256, (9,), generator=rng).tolist()
    prompts = [base[: int(torch.randint(1, 9, (1,), generator=rng))] + [i] * (i % 5 + 1) for i in range(10)]
    roomy = build_core(model, num_blocks=128, block_size=4)
    expected = _run_all(roomy, prompts)
    tight = build_core(model, num_blocks=10, block_size=4, max_batched_tokens=7, max_num_seqs=6)
    for i, p in enumerate(prompts):
        tight.submit(greedy_request(f"r{i}", p, MAX_TOKENS))
    aborted = {"r3", "r7"}
    out: dict[str, list] = {}
    cached: set[int] = set()
    for step in range(10_000):
        if not tight.has_work:
            break
        if step == 5:
            for rid in aborted:
                tight.abort(rid)
        result = tight.step()
        for event in result.events:
            (cached.update if event.type.value == "stored" else cached.difference_update)(event.hashes)
        for rid, chunk in result.chunks:
            out.setdefault(rid, []).append(chunk)
    for i in range(len(prompts)):
        if f"r{i}" not in aborted:
            assert tokens_of(out[f"r{i}"]) == expected[i], i
    assert tight.scheduler.num_preemptions > 0
    assert tight.scheduler.blocks.num_free_blocks == 10
    assert cached == set(tight.scheduler.blocks.cached_hashes())

"""SimScheduler: prefix accounting, timing model and admission, driven by explicit times."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvgate_core.kvcontract.events import EventType, KVEvent
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from kvgate_core.tokenize.tokenizer import ByteTokenizer
from workers.engine.block_manager import BlockManager
from workers.engine_api import (
    ContextTooLongError,
    FinishReason,
    GenerationChunk,
    GenerationRequest,
    SamplingParams,
)
from workers.sim.scheduler import SimScheduler, SimTiming
from workers.sim.text import WordBook

BS = 16
_TOK = ByteTokenizer()


def _sched(num_blocks: int = 64, events: list[KVEvent] | None = None, **timing: float) -> SimScheduler:
    blocks = BlockManager(num_blocks, BS, on_event=events.append if events is not None else None)
    params = {"prefill_tps": 1000.0, "decode_tps": 100.0, "max_running": 4, **timing}
    t = SimTiming(
        prefill_tps=params["prefill_tps"],
        decode_tps=params["decode_tps"],
        max_running=int(params["max_running"]),
    )
    return SimScheduler(blocks, t, WordBook(_TOK.encode, _TOK.decode), "m")


def _req(prompt: list[int], max_tokens: int = 4, **kw: object) -> GenerationRequest:
    return GenerationRequest("r", tuple(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw))  # type: ignore[arg-type]


def _drive(s: SimScheduler, until: float, dt: float = 0.001) -> None:
    t = 0.0
    while t <= until:
        s.step(t)
        t += dt


def test_repeated_prefix_reports_shared_full_blocks_as_cached():
    s = _sched()
    out_a: list[GenerationChunk] = []
    out_b: list[GenerationChunk] = []
    s.submit(_req(list(range(40))), out_a.append)
    _drive(s, 0.2)
    s.submit(_req([*range(33), 99, 98]), out_b.append)  # shares two full blocks (32 tokens)
    _drive(s, 0.2)
    assert out_a[-1].num_cached_tokens == 0
    assert out_b[-1].num_cached_tokens == 32
    assert out_b[-1].finish_reason is FinishReason.LENGTH


def test_first_token_waits_for_uncached_prefill_only():
    s = _sched(prefill_tps=100.0)
    out: list[GenerationChunk] = []
    s.submit(_req(list(range(50)), max_tokens=1), out.append)
    assert s.step(0.0) == pytest.approx(0.5)  # 50 uncached tokens at 100 tokens/s
    s.step(0.49)
    assert out == []
    s.step(0.5)
    assert out[0].token_ids
    assert out[0].finish_reason is FinishReason.LENGTH


def test_a_prefix_in_prefill_is_already_a_hit_and_finishes_first():
    s = _sched(prefill_tps=100.0, decode_tps=1000.0)
    first: list[GenerationChunk] = []
    second: list[GenerationChunk] = []
    s.submit(_req(list(range(40)), max_tokens=1), first.append)
    s.step(0.0)  # first prefill: 40 tokens, until 0.4
    s.submit(_req([*range(33), 7, 7, 7], max_tokens=1), second.append)
    assert s.step(0.1) == pytest.approx(0.4)
    s.step(0.4)
    assert first
    assert not second
    assert s.step(0.41) == pytest.approx(0.44)  # then its 4 uncached tokens
    s.step(0.44)
    assert second[-1].num_cached_tokens == 32


def test_prefill_is_one_fifo_server_shared_by_requests():
    s = _sched(prefill_tps=100.0)
    s.submit(_req([1] * 50, max_tokens=1), lambda c: None)
    s.submit(_req([2] * 50, max_tokens=1), lambda c: None)
    s.step(0.0)
    assert s.step(0.5) == pytest.approx(1.0)


def test_decode_rate_and_catch_up_after_a_late_step():
    s = _sched(prefill_tps=1e9, decode_tps=10.0)
    out: list[GenerationChunk] = []
    s.submit(_req([1, 2, 3], max_tokens=5), out.append)
    s.step(0.0)
    s.step(0.001)  # prefill done: first token
    assert sum(len(c.token_ids) for c in out) == 1
    s.step(0.35)  # three more tokens fell due (about 0.1, 0.2, 0.3): one chunk
    assert [len(c.token_ids) for c in out] == [1, 3]
    s.step(0.41)
    assert out[-1].finish_reason is FinishReason.LENGTH
    assert out[-1].num_output_tokens == 5


def test_max_running_queues_the_rest_fifo():
    s = _sched(max_running=1, prefill_tps=1e9, decode_tps=1000.0)
    done: list[str] = []
    s.submit(_req([1] * 4, max_tokens=2), lambda c: c.finish_reason and done.append("a"))
    s.submit(_req([2] * 4, max_tokens=2), lambda c: c.finish_reason and done.append("b"))
    s.step(0.0)
    assert (s.num_running, s.num_waiting) == (1, 1)
    _drive(s, 0.05)
    assert done == ["a", "b"]
    assert s.num_running == s.num_waiting == 0


def test_admission_waits_for_kv_and_rejects_what_can_never_fit():
    s = _sched(num_blocks=4, prefill_tps=1e9, decode_tps=1000.0)
    s.submit(_req([1] * 40, max_tokens=8), lambda c: None)  # 3 blocks for prompt + output
    s.submit(_req([2] * 20, max_tokens=8), lambda c: None)  # 2 blocks: must wait
    s.step(0.0)
    assert (s.num_running, s.num_waiting) == (1, 1)
    _drive(s, 0.1)
    assert s.num_running == s.num_waiting == 0
    with pytest.raises(ContextTooLongError):
        s.submit(_req([3] * 70, max_tokens=1), lambda c: None)


def test_output_is_deterministic_per_prompt_and_seed():
    def run(prompt: list[int], seed: int) -> str:
        s = _sched(prefill_tps=1e9, decode_tps=1e6)
        out: list[GenerationChunk] = []
        s.submit(_req(prompt, max_tokens=30, seed=seed), out.append)
        _drive(s, 0.01)
        return "".join(c.text for c in out)

    assert run([5] * 10, 1) == run([5] * 10, 1)
    assert run([5] * 10, 1) != run([5] * 10, 2)
    assert run([5] * 10, 1) != run([6] * 10, 1)


def test_stop_string_cuts_the_text():
    s = _sched(prefill_tps=1e9, decode_tps=1e6)
    out: list[GenerationChunk] = []
    s.submit(_req([5] * 10, max_tokens=200, stop=("e",)), out.append)
    _drive(s, 0.01)
    text = "".join(c.text for c in out)
    assert "e" not in text
    assert out[-1].finish_reason is FinishReason.STOP


def test_abort_frees_blocks_and_keeps_prefix_cached():
    events: list[KVEvent] = []
    s = _sched(events=events, prefill_tps=1e9, decode_tps=1.0)
    seq = s.submit(_req(list(range(40)), max_tokens=50), lambda c: None)
    s.step(0.0)
    s.step(0.001)
    s.abort(seq)
    assert s.num_running == 0
    assert s.blocks.num_free_blocks == s.blocks.num_total_blocks
    stored = [h for e in events if e.type is EventType.STORED for h in e.hashes]
    assert stored == chain_hashes(list(range(40)), root_hash("m"), BS)
    assert set(stored) <= set(s.blocks.cached_hashes())


def test_extra_keys_change_the_hash_root():
    s = _sched(prefill_tps=1e9, decode_tps=1e6)
    out: list[GenerationChunk] = []
    s.submit(_req(list(range(40))), out.append)
    _drive(s, 0.01)
    salted = GenerationRequest("r2", tuple(range(40)), SamplingParams(max_tokens=2), extra_keys=("salt",))
    s.submit(salted, out.append)
    _drive(s, 0.01)
    assert out[-1].num_cached_tokens == 0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 40), st.integers(1, 20), st.booleans()),
        min_size=1,
        max_size=25,
    )
)
def test_random_mixes_finish_without_leaks_and_events_match_the_cache(specs):
    events: list[KVEvent] = []
    s = _sched(num_blocks=12, events=events, prefill_tps=2000.0, decode_tps=500.0, max_running=3)
    out: dict[int, list[GenerationChunk]] = {}
    seqs = []
    for i, (prefix, extra, max_tokens, abort) in enumerate(specs):
        prompt = [prefix] * 20 + [100 + i] * extra  # three shared prefixes, one full block each
        if s.blocks.blocks_for(len(prompt) + max_tokens) > 12:
            continue
        out[i] = []
        seqs.append((s.submit(_req(prompt, max_tokens), out[i].append), abort, len(prompt), max_tokens))
    t = 0.0
    for seq, abort, _, _ in seqs:
        t += 0.002
        s.step(t)
        if abort:
            s.abort(seq)
    while s.num_running or s.num_waiting:
        t += 0.002
        s.step(t)
        assert t < 60, "the simulation must drain"
    assert s.blocks.num_free_blocks == s.blocks.num_total_blocks
    for (_, abort, n, max_tokens), chunks in zip(seqs, out.values(), strict=True):
        if not abort:
            assert chunks[-1].num_output_tokens == max_tokens
            assert chunks[-1].num_cached_tokens % BS == 0
            assert chunks[-1].num_cached_tokens <= n - 1
    cached: set[int] = set()
    for e in events:
        cached = cached | set(e.hashes) if e.type is EventType.STORED else cached - set(e.hashes)
    assert cached == set(s.blocks.cached_hashes())

"""``bench_routing --fleet foreign``'s workload in the workers' units: word prompts and a scaled fleet."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.foreign_fleet import WorkerFleet, as_words, worker_tokens_per_token
from loadtest.workloads import Session, WorkRequest
from workers.sim.foreign import foreign_bundle


def _completion(ids: list[int]) -> Session:
    body = {"model": "m", "prompt": np.array(ids, dtype=np.uint32), "max_tokens": 2}
    return Session("t", (WorkRequest("completions", body),))


def test_token_ids_become_one_word_each_and_equal_ids_equal_words() -> None:
    a, b = as_words([_completion([3, 1, 4, 1]), _completion([3, 1, 5])])
    text_a, text_b = a.requests[0].body["prompt"], b.requests[0].body["prompt"]
    assert text_a == "w3 w1 w4 w1"
    assert text_b.startswith("w3 w1 ")
    assert len(foreign_bundle("m").tokenizer.encode(text_a)) == 4
    chat = Session("c", (WorkRequest("chat", {"messages": [{"role": "user", "content": "hi"}]}),))
    assert as_words([chat]) == [chat]


def test_units_ratio_is_words_per_byte_for_chat_and_one_for_token_ids() -> None:
    ids = [_completion(list(range(40)))]
    assert worker_tokens_per_token(ids, as_words(ids)) == pytest.approx(1.0)
    chat = [Session("c", (WorkRequest("chat", {"messages": [{"role": "user", "content": "abcd " * 50}]}),))]
    ratio = worker_tokens_per_token(chat, chat)
    assert 0.1 < ratio < 0.25  # 52 words over ~280 ChatML bytes


def test_scaled_fleet_keeps_whole_blocks_and_passes_its_flags() -> None:
    fleet = WorkerFleet.scaled(16_384, 20_000, 0.15)
    assert fleet.kv_tokens % 16 == 0 and abs(fleet.kv_tokens - 16_384 * 0.15) < 16
    assert fleet.prefill_tps == pytest.approx(3_000)
    args = fleet.worker_args(100, 32)
    assert args[0] == "--foreign"
    assert args[args.index("--kv-tokens") + 1] == str(fleet.kv_tokens)
    assert "foreign" in fleet.describe()
